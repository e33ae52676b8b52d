//! The `remote` provider: scratch databases from a sandbox/branching service behind the HTTP
//! API in `docs/remote-provider.yaml`. A fork is create (idempotent per token) → set TTL →
//! poll until ready; its connection parameters are asked for again after a gateway restart,
//! never stored. Every call is bounded: a connect timeout, a per-request timeout, a limited
//! number of retries with backoff (connect errors, timeouts, 429 and 5xx only), and one
//! deadline over the whole fork, after which the half-made sandbox is deleted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use time::OffsetDateTime;

use super::remote_api::{self as api, Sandbox, SandboxState};
use super::{Backend, BackendTag, BoxFuture, Provider, ProviderError};
use crate::pgconn::tls::{self as btls, SslMode};
use crate::pgconn::{BackendAddr, BackendTarget, Endpoint};

/// Settings of the `remote` provider.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Base URL of the API.
    pub url: String,
    /// Bearer key, if the service wants one.
    pub api_key: Option<String>,
    /// Golden sandbox to fork.
    pub golden: String,
    /// `sandpit.owner` label of this gateway's sandboxes.
    pub owner: String,
    /// Connect timeout per request.
    pub connect_timeout: Duration,
    /// Timeout per request.
    pub request_timeout: Duration,
    /// Deadline for a whole fork.
    pub fork_timeout: Duration,
    /// Retries per request on connect errors, timeouts, 429 and 5xx.
    pub retries: u32,
    /// Added to the token's remaining life for the sandbox TTL.
    pub ttl_grace: Duration,
    /// Minimum TLS towards sandboxes.
    pub sslmode: SslMode,
    /// CA file to verify sandboxes with.
    pub ca_file: Option<PathBuf>,
}

/// Forks are sandboxes of a remote service.
pub struct RemoteProvider {
    http: reqwest::Client,
    base: String,
    cfg: RemoteConfig,
    require: Option<Arc<rustls::ClientConfig>>,
    verify: Option<Arc<rustls::ClientConfig>>,
    /// Sandbox id of the review reference (a pristine fork), once made.
    reference: tokio::sync::Mutex<Option<String>>,
}

/// Token label of review reference sandboxes: never a token id, so `list()` leaves them out
/// and the janitor never reaps them; their TTL bounds a leaked one.
const REFERENCE_LABEL: &str = "sandpit-review-reference";
/// How long the service keeps a reference sandbox; a review after that forks a new one.
const REFERENCE_TTL: Duration = Duration::from_secs(24 * 3600);

fn remote(e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Remote(e.to_string())
}

fn rank(m: SslMode) -> u8 {
    match m {
        SslMode::Disable => 0,
        SslMode::Require => 1,
        SslMode::VerifyFull => 2,
    }
}

impl RemoteProvider {
    /// Builds the HTTP client and the TLS settings; contacts nothing yet.
    pub fn new(cfg: RemoteConfig) -> Result<Self, ProviderError> {
        let mut http = reqwest::Client::builder().use_rustls_tls();
        // The CA that verifies sandboxes also verifies the API (a worker signs both).
        if let Some(ca) = &cfg.ca_file {
            let pem = std::fs::read(ca).map_err(|source| ProviderError::RemoteIo {
                what: ca.display().to_string(),
                source,
            })?;
            for c in reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| {
                ProviderError::RemoteHttp {
                    what: ca.display().to_string(),
                    source,
                }
            })? {
                http = http.add_root_certificate(c);
            }
        }
        let http = http
            .connect_timeout(cfg.connect_timeout)
            .timeout(cfg.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|source| ProviderError::RemoteHttp {
                what: "HTTP client".into(),
                source,
            })?;
        let require = btls::client_config(SslMode::Require, cfg.ca_file.as_deref())?;
        let verify = btls::client_config(SslMode::VerifyFull, cfg.ca_file.as_deref())?;
        Ok(RemoteProvider {
            http,
            base: cfg.url.trim_end_matches('/').to_string(),
            cfg,
            require,
            verify,
            reference: tokio::sync::Mutex::new(None),
        })
    }

    /// Whether this service holds (or is just making or checking) a review reference.
    pub(super) fn holds_reference(&self) -> bool {
        self.reference.try_lock().map_or(true, |r| r.is_some())
    }

    /// The reference sandbox: the one made earlier while the service still has it, else a
    /// new fork of the golden.
    async fn reference_inner(&self) -> Result<Backend, ProviderError> {
        let mut current = self.reference.lock().await;
        if let Some(id) = current.as_deref() {
            match self.ensure_running(id).await {
                Ok(mut b) => {
                    b.method = "reference".into();
                    return Ok(b);
                }
                Err(ProviderError::NotFound(_)) => *current = None,
                Err(e) => return Err(e),
            }
        }
        let expires = OffsetDateTime::now_utc() + REFERENCE_TTL;
        let tag = BackendTag {
            // Unique per fork: the label doubles as the create's idempotency key, and a key
            // the service remembers would hand back the reference it has since deleted.
            token_id: format!(
                "{REFERENCE_LABEL}-{}",
                OffsetDateTime::now_utc().unix_timestamp_nanos()
            ),
            task: "sandpit review reference".into(),
            expires_at: crate::rfc3339::try_format(expires)
                .map_err(|e| remote(format!("formatting the reference expiry: {e}")))?,
            gateway_id: String::new(),
            golden: None,
        };
        let mut b = self.fork(&tag).await?;
        *current = Some(b.handle.clone());
        b.method = "reference".into();
        Ok(b)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.cfg.fork_timeout
    }

    async fn get(&self, id: &str, deadline: Instant) -> Result<Option<Sandbox>, ProviderError> {
        Ok(self
            .call_json(
                Method::GET,
                &format!("/v1/sandboxes/{id}"),
                None,
                None,
                deadline,
            )
            .await?
            .1)
    }

    /// Polls until the sandbox is ready (or failed, gone, or past the deadline).
    async fn wait_ready(
        &self,
        mut sb: Sandbox,
        deadline: Instant,
    ) -> Result<Sandbox, ProviderError> {
        let mut pause = Duration::from_millis(50);
        loop {
            match sb.state {
                SandboxState::Ready => return Ok(sb),
                SandboxState::Failed => {
                    return Err(remote(format!(
                        "sandbox {} failed: {}",
                        sb.id,
                        sb.error.as_deref().unwrap_or("no reason given")
                    )))
                }
                SandboxState::Creating => {}
            }
            if Instant::now() + pause >= deadline {
                return Err(remote(format!(
                    "sandbox {} not ready within {}s",
                    sb.id,
                    self.cfg.fork_timeout.as_secs()
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
            sb = self
                .get(&sb.id, deadline)
                .await?
                .ok_or_else(|| ProviderError::NotFound(sb.id.clone()))?;
        }
    }

    /// The backend of a ready sandbox.
    fn backend(&self, sb: &Sandbox, method: &str) -> Result<Backend, ProviderError> {
        let c = sb
            .connection
            .as_ref()
            .ok_or_else(|| remote(format!("sandbox {} is ready but has no connection", sb.id)))?;
        let offered = c
            .sslmode
            .as_deref()
            .and_then(SslMode::parse)
            .unwrap_or(SslMode::Disable);
        let mode = if rank(offered) > rank(self.cfg.sslmode) {
            offered
        } else {
            self.cfg.sslmode
        };
        let tls = match mode {
            SslMode::Disable => None,
            SslMode::Require => btls::for_host(&self.require, &c.host),
            SslMode::VerifyFull => btls::for_host(&self.verify, &c.host),
        };
        Ok(Backend {
            handle: sb.id.clone(),
            target: BackendTarget {
                endpoint: Endpoint {
                    addr: BackendAddr::Tcp {
                        host: c.host.clone(),
                        port: c.port,
                    },
                    tls,
                },
                user: c.user.clone(),
                database: c.database.clone(),
                password: c.password.clone(),
                gate: None,
            },
            method: method.to_string(),
            netns: false,
            golden: sb.version.clone(),
        })
    }

    async fn fork_inner(
        &self,
        tag: &BackendTag,
        deadline: Instant,
        made: &std::sync::Mutex<Option<String>>,
    ) -> Result<Backend, ProviderError> {
        let metadata = [
            (api::META_OWNER, self.cfg.owner.as_str()),
            (api::META_TOKEN, tag.token_id.as_str()),
            (api::META_TASK, tag.task.as_str()),
            (api::META_EXPIRES, tag.expires_at.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let body = json(&api::CreateSandbox {
            golden: self.cfg.golden.clone(),
            metadata,
        })?;
        let (_, sb) = self
            .call_json::<Sandbox>(
                Method::POST,
                "/v1/sandboxes",
                Some(&body),
                Some(&tag.token_id),
                deadline,
            )
            .await?;
        let sb = sb.ok_or_else(|| remote("create answered without a sandbox"))?;
        if !api::valid_id(&sb.id) {
            return Err(remote("create answered with a malformed sandbox id"));
        }
        let id = sb.id.clone();
        *made.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.clone());
        let result = async {
            let left = crate::rfc3339::parse(&tag.expires_at)
                .map(|t| (t - OffsetDateTime::now_utc()).whole_seconds().max(0) as u64)
                .unwrap_or(0);
            let ttl = json(&api::SetTtl {
                ttl_seconds: left + self.cfg.ttl_grace.as_secs(),
            })?;
            self.call_json::<Sandbox>(
                Method::PUT,
                &format!("/v1/sandboxes/{id}/ttl"),
                Some(&ttl),
                None,
                deadline,
            )
            .await?
            .1
            .ok_or_else(|| ProviderError::NotFound(id.clone()))?;
            let sb = self.wait_ready(sb, deadline).await?;
            self.backend(&sb, "remote")
        }
        .await;
        if result.is_err() {
            if let Err(e) = self.delete(&id).await {
                tracing::warn!(sandbox = %id, error = %e, "deleting a half-made sandbox failed (its TTL will reap it)");
            }
        }
        result
    }

    async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        if !api::valid_id(id) {
            return Err(ProviderError::NotFound(format!("invalid handle {id:?}")));
        }
        // Its own deadline: cleanup after a timed-out fork must still get its chance.
        let deadline = Instant::now() + self.cfg.request_timeout * (self.cfg.retries + 1);
        self.call_json::<serde_json::Value>(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
            None,
            deadline,
        )
        .await?;
        Ok(())
    }
}

impl Provider for RemoteProvider {
    fn verify_forks_by_default(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "remote"
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let t0 = Instant::now();
            let deadline = self.deadline();
            // The outer bound covers what the inner checks cannot (a slow body, a stuck poll);
            // a sandbox made before it fired is deleted here, since the inner cleanup was cut.
            let made = std::sync::Mutex::new(None);
            let inner = self.fork_inner(tag, deadline, &made);
            let b = match tokio::time::timeout_at(deadline.into(), inner).await {
                Ok(r) => r?,
                Err(_) => {
                    let id = made.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(id) = id {
                        if let Err(e) = self.delete(&id).await {
                            tracing::warn!(sandbox = %id, error = %e, "deleting a timed-out sandbox failed (its TTL will reap it)");
                        }
                    }
                    return Err(remote(format!(
                        "fork did not complete within {}s",
                        self.cfg.fork_timeout.as_secs()
                    )));
                }
            };
            tracing::info!(handle = %b.handle, token = %tag.token_id,
                elapsed_ms = t0.elapsed().as_millis() as u64, "sandbox forked");
            Ok(b)
        })
    }

    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            if !api::valid_id(handle) {
                return Err(ProviderError::NotFound(format!(
                    "invalid handle {handle:?}"
                )));
            }
            let deadline = self.deadline();
            let sb = self
                .get(handle, deadline)
                .await?
                .ok_or_else(|| ProviderError::NotFound(handle.to_string()))?;
            let sb = self.wait_ready(sb, deadline).await?;
            self.backend(&sb, "adopted")
        })
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.delete(handle))
    }

    fn stop<'a>(&'a self, _handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        // The service owns the sandbox's life; its TTL is the backstop.
        Box::pin(async { Ok(()) })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            let label = format!("{}={}", api::META_OWNER, self.cfg.owner);
            let path = format!("/v1/sandboxes?label={}", url_encode(&label));
            let (_, list) = self
                .call_json::<api::SandboxList>(Method::GET, &path, None, None, self.deadline())
                .await?;
            let mut out = Vec::new();
            for sb in list.map(|l| l.sandboxes).unwrap_or_default() {
                if !api::valid_id(&sb.id)
                    || sb.metadata.get(api::META_OWNER) != Some(&self.cfg.owner)
                    || sb
                        .metadata
                        .get(api::META_TOKEN)
                        .is_some_and(|t| t.starts_with(REFERENCE_LABEL))
                {
                    continue;
                }
                let m = &sb.metadata;
                let tag = match (
                    m.get(api::META_TOKEN),
                    m.get(api::META_TASK),
                    m.get(api::META_EXPIRES),
                ) {
                    (Some(t), Some(k), Some(e)) => Some(BackendTag {
                        token_id: t.clone(),
                        task: k.clone(),
                        expires_at: e.clone(),
                        // The owner label already scopes the list to this gateway.
                        gateway_id: String::new(),
                        golden: None,
                    }),
                    _ => None,
                };
                out.push((sb.id, tag));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }

    fn secrets(&self) -> Vec<String> {
        vec![self.base.clone()]
    }

    // One golden, no versions (golden builds are instance-only): one reference.
    fn reference<'a>(
        &'a self,
        _golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(self.reference_inner())
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async move {
            match self.reference.lock().await.take() {
                Some(id) => self.delete(&id).await,
                None => Ok(()),
            }
        })
    }
}

pub mod book;
mod goldens;
mod http;
mod place;
mod rooms;
mod set;

use http::{json, url_encode};
pub use set::RemoteSet;

#[cfg(test)]
mod tests;
