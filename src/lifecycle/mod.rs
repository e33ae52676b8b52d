//! The life of a token: issue, lazy single-flight fork, TTL expiry, revoke. Ending a token
//! ends its sessions (they see the reason), destroys its backend, and marks the record.

mod faults;
mod issue_check;
pub mod janitor;
mod replicas;
mod stop;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use serde::Serialize;
use time::OffsetDateTime;
use tokio::sync::{watch, Mutex};

use crate::auth::ratelimit::AuthLimiter;
use crate::auth::{self, Verifier};
use crate::config::Config;
use crate::journal::log::LogBook;
use crate::provider::{Backend, BackendTag, BoxFuture, Provider, ProviderError};
use crate::registry::{CapMode, Caps, Registry, RegistryError, TokenRecord, TokenState};
use crate::rfc3339::format as rfc3339;

/// Why a token stopped being usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// TTL passed.
    Expired,
    /// Revoked by the harness.
    Revoked,
    /// The gateway is shutting down (token stays valid).
    Shutdown,
}

impl EndReason {
    /// Message the client sees.
    pub fn message(self) -> &'static str {
        match self {
            EndReason::Expired => "terminating connection because the sandpit token expired",
            EndReason::Revoked => "terminating connection because the sandpit token was revoked",
            EndReason::Shutdown => {
                "terminating connection because the sandpit gateway is shutting down"
            }
        }
    }
}

/// What happens around a token's life that the lifecycle does not own (the review), set up
/// by `server.rs`: the lifecycle calls these and never imports the modules above it.
pub trait TokenHooks: Send + Sync + 'static {
    /// A backend was just forked for a token, from golden version `golden`.
    fn forked(&self, golden: Option<String>);
    /// A token ended; called right before its backend is destroyed (failures are the hook's
    /// to log: they never block the destroy).
    fn ending<'a>(&'a self, rec: &'a TokenRecord) -> BoxFuture<'a, ()>;
}

/// Hooks that do nothing.
pub struct NoHooks;

impl TokenHooks for NoHooks {
    fn forked(&self, _golden: Option<String>) {}
    fn ending<'a>(&'a self, _rec: &'a TokenRecord) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Errors of lifecycle operations.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("unknown token {0}")]
    Unknown(String),
    #[error("token {0} is {1}")]
    NotUsable(String, TokenState),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

/// What the harness asks for at issue.
#[derive(Debug, Clone, Default)]
pub struct IssueRequest {
    /// Task name.
    pub task: String,
    /// TTL; default from config.
    pub ttl: Option<Duration>,
    /// Row cap; default from config.
    pub max_rows: Option<u64>,
    /// Byte cap; default from config.
    pub max_bytes: Option<u64>,
    /// Concurrent sessions; default from config.
    pub max_connections: Option<u32>,
    /// Truncate (default) or error when a result exceeds a cap.
    pub cap_mode: Option<CapMode>,
    /// Seatbelt policy: allowed statement kinds (None = all).
    pub allow: Option<Vec<String>>,
    /// Statement timeout; default from config (zero = none).
    pub statement_timeout: Option<Duration>,
    /// Idle-in-transaction timeout; default from config (zero = none).
    pub idle_in_transaction_timeout: Option<Duration>,
    /// Free-form metadata.
    pub metadata: BTreeMap<String, String>,
    /// Sessions log in as a superuser of the token's own backend (providers whose
    /// [`Provider::superuser_sessions`] says yes; refused elsewhere).
    pub superuser: bool,
}

/// A token as shown to the harness (never includes the secret, except `dsn` right at issue).
#[derive(Debug, Clone, Serialize)]
pub struct TokenView {
    /// Public id.
    pub id: String,
    /// Only at issue: the DSN the agent uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dsn: Option<String>,
    /// Task name.
    pub task: String,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Issue time, RFC 3339.
    pub created_at: String,
    /// Expiry, RFC 3339.
    pub expires_at: String,
    /// issued / live / expired / revoked.
    pub state: TokenState,
    /// Row cap per statement.
    pub max_rows: u64,
    /// Byte cap per statement.
    pub max_bytes: u64,
    /// Session cap.
    pub max_connections: u32,
    /// truncate / error.
    pub cap_mode: CapMode,
    /// Allowed statement kinds, when a seatbelt policy is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// Statement timeout, ms (0 = none).
    pub statement_timeout_ms: u64,
    /// Idle-in-transaction timeout, ms (0 = none).
    pub idle_in_transaction_timeout_ms: u64,
    /// Whether a backend exists now.
    pub backend: bool,
    /// Forks made for this token.
    pub fork_count: u64,
    /// Golden version its backend was copied from (instance provider), once forked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
    /// Whether its sessions log in as a superuser of its own backend.
    pub superuser: bool,
    /// Sessions open now.
    pub sessions: u32,
}

/// Runtime state of one token in this process.
pub struct TokenRuntime {
    backend: Mutex<Option<Backend>>,
    sessions: AtomicU32,
    ended: watch::Sender<Option<EndReason>>,
    /// When the last session ended (for idle suspend).
    idle_since: std::sync::Mutex<std::time::Instant>,
}

impl TokenRuntime {
    fn new() -> Self {
        TokenRuntime {
            backend: Mutex::new(None),
            sessions: AtomicU32::new(0),
            ended: watch::channel(None).0,
            idle_since: std::sync::Mutex::new(std::time::Instant::now()),
        }
    }

    /// A receiver that fires when the token ends.
    pub fn ended(&self) -> watch::Receiver<Option<EndReason>> {
        self.ended.subscribe()
    }
}

/// Holds one session slot of a token; frees it on drop.
pub struct SessionSlot(Arc<TokenRuntime>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        if self.0.sessions.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) =
                std::time::Instant::now();
        }
        metrics::gauge!("sandpit_sessions").decrement(1.0);
    }
}

/// The gateway's shared state.
pub struct Gateway {
    /// Configuration.
    pub config: Config,
    /// Token store.
    pub registry: Registry,
    /// Scratch database source.
    pub provider: Arc<dyn Provider>,
    /// Open statement logs.
    pub logs: LogBook,
    hooks: Arc<dyn TokenHooks>,
    /// Authentication failures per source address and token id, over Postgres and MCP.
    pub auth_limiter: AuthLimiter,
    runtimes: DashMap<String, Arc<TokenRuntime>>,
    secrets: Vec<String>,
    /// Stable id of this gateway's data dir, written into every backend's tag.
    gateway_id: String,
    /// One janitor pass at a time (scheduled or asked for over the API).
    janitor_lock: Mutex<()>,
    /// Tokens whose expiry timer runs in this process.
    expiry_scheduled: DashMap<String, ()>,
}

impl Gateway {
    /// Assemble the gateway state.
    pub fn new(config: Config, registry: Registry, provider: Arc<dyn Provider>) -> Arc<Gateway> {
        Self::with_id(config, registry, provider, String::new(), Arc::new(NoHooks))
    }

    /// Assemble the gateway state with the id that tags its backends (see `janitor::gateway_id`)
    /// and the hooks called at a token's fork and end.
    pub fn with_id(
        config: Config,
        registry: Registry,
        provider: Arc<dyn Provider>,
        gateway_id: String,
        hooks: Arc<dyn TokenHooks>,
    ) -> Arc<Gateway> {
        let secrets = provider.secrets();
        let auth_limiter = AuthLimiter::new(config.limits.auth_failures_per_minute);
        Arc::new(Gateway {
            config,
            registry,
            provider,
            logs: LogBook::default(),
            hooks,
            auth_limiter,
            runtimes: DashMap::new(),
            secrets,
            gateway_id,
            janitor_lock: Mutex::new(()),
            expiry_scheduled: DashMap::new(),
        })
    }

    /// The id written into every backend's tag.
    pub fn gateway_id(&self) -> &str {
        &self.gateway_id
    }

    /// Sessions open now, over all tokens.
    pub fn session_count(&self) -> u32 {
        self.runtimes
            .iter()
            .map(|r| r.sessions.load(Ordering::Acquire))
            .sum()
    }

    /// Strings that must never reach a client.
    pub fn secrets(&self) -> &[String] {
        &self.secrets
    }

    /// The runtime state of a token (created on first use).
    pub fn runtime(&self, id: &str) -> Arc<TokenRuntime> {
        self.runtimes
            .entry(id.to_string())
            .or_insert_with(|| Arc::new(TokenRuntime::new()))
            .clone()
    }

    /// Issue a token; returns its view with the DSN.
    pub async fn issue(self: &Arc<Self>, req: IssueRequest) -> Result<TokenView, LifecycleError> {
        let d = &self.config.tokens;
        if req.task.trim().is_empty() || req.task.len() > 200 {
            return Err(LifecycleError::Invalid(
                "task must be 1 to 200 characters".into(),
            ));
        }
        if req.task.contains(['/', '\\', '\0']) || req.task.starts_with('.') {
            return Err(LifecycleError::Invalid(
                "task must not contain '/', '\\' or NUL, nor start with '.'".into(),
            ));
        }
        let ttl = req.ttl.unwrap_or(d.ttl);
        if ttl.is_zero() || ttl > d.max_ttl {
            return Err(LifecycleError::Invalid(format!(
                "ttl must be between 1s and {}",
                crate::config::display_duration(d.max_ttl)
            )));
        }
        let max_rows = req.max_rows.unwrap_or(d.max_rows);
        let max_bytes = req.max_bytes.unwrap_or(d.max_bytes);
        let max_connections = req.max_connections.unwrap_or(d.max_connections);
        if max_rows == 0 || max_bytes == 0 || max_connections == 0 {
            return Err(LifecycleError::Invalid(
                "max_rows, max_bytes and max_connections must be at least 1".into(),
            ));
        }
        if max_rows > d.max_rows_limit || max_bytes > d.max_bytes_limit {
            return Err(LifecycleError::Invalid(format!(
                "max_rows may be at most {} and max_bytes at most {} (tokens.max_rows_limit / max_bytes_limit)",
                d.max_rows_limit, d.max_bytes_limit
            )));
        }
        let allow = issue_check::allow_kinds(req.allow)?;
        issue_check::superuser(req.superuser, self.provider.as_ref())?;
        let id = auth::new_token_id();
        let secret = auth::new_secret();
        let now = OffsetDateTime::now_utc();
        // A golden switched to after this is for tokens issued after it.
        let golden = self
            .provider
            .pin_golden(&id, &rfc3339(now + ttl))
            .await
            .map_err(LifecycleError::Provider)?;
        let rec = TokenRecord {
            id: id.clone(),
            task: req.task,
            metadata: req.metadata,
            created_at: now,
            expires_at: now + ttl,
            caps: Caps {
                max_rows,
                max_bytes,
                max_connections,
                cap_mode: req.cap_mode.unwrap_or_default(),
                allow,
                statement_timeout_ms: ms(req.statement_timeout.unwrap_or(d.statement_timeout)),
                idle_in_transaction_timeout_ms: ms(req
                    .idle_in_transaction_timeout
                    .unwrap_or(d.idle_in_transaction_timeout)),
            },
            state: TokenState::Issued,
            verifier: Verifier::from_secret(&secret),
            backend: None,
            fork_count: 0,
            golden,
            superuser: req.superuser,
            ended_at: None,
        };
        self.registry.insert(rec.clone()).await?;
        metrics::counter!("sandpit_tokens_issued_total").increment(1);
        self.schedule_expiry(&rec);
        let mut view = self.view(&rec);
        view.dsn = Some(format!(
            "postgresql://{}:{}@{}:{}/sandpit",
            id,
            secret,
            self.config.dsn_host(),
            self.config.listen.port()
        ));
        tracing::info!(token = %id, task = %rec.task, expires_at = %view.expires_at, "token issued");
        Ok(view)
    }

    /// The harness-facing view of a record.
    pub fn view(&self, rec: &TokenRecord) -> TokenView {
        let sessions = self
            .runtimes
            .get(&rec.id)
            .map(|r| r.sessions.load(Ordering::Acquire))
            .unwrap_or(0);
        TokenView {
            id: rec.id.clone(),
            dsn: None,
            task: rec.task.clone(),
            metadata: rec.metadata.clone(),
            created_at: rfc3339(rec.created_at),
            expires_at: rfc3339(rec.expires_at),
            state: rec.state,
            max_rows: rec.caps.max_rows,
            max_bytes: rec.caps.max_bytes,
            max_connections: rec.caps.max_connections,
            cap_mode: rec.caps.cap_mode,
            allow: rec.caps.allow.clone(),
            statement_timeout_ms: rec.caps.statement_timeout_ms,
            idle_in_transaction_timeout_ms: rec.caps.idle_in_transaction_timeout_ms,
            backend: rec.backend.is_some(),
            fork_count: rec.fork_count,
            golden: rec.golden.clone(),
            superuser: rec.superuser,
            sessions,
        }
    }

    fn schedule_expiry(self: &Arc<Self>, rec: &TokenRecord) {
        // Once per token and process; with a shared registry every replica that knows the
        // token runs one, and the registry's row lock lets exactly one of them end it.
        if self.expiry_scheduled.insert(rec.id.clone(), ()).is_some() {
            return;
        }
        let gw = Arc::downgrade(self);
        let id = rec.id.clone();
        let left = rec.expires_at - OffsetDateTime::now_utc();
        let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
        tokio::spawn(async move {
            tokio::time::sleep(left).await;
            if let Some(gw) = gw.upgrade() {
                if let Err(e) = gw.end(&id, EndReason::Expired).await {
                    tracing::warn!(token = %id, error = %e, "expiring token failed");
                }
            }
        });
    }

    /// At start: schedule expiry for every usable token; end the ones whose TTL passed while
    /// the gateway was down (right here, so their backends are gone before `serve` is ready).
    pub async fn resume(self: &Arc<Self>) {
        let now = OffsetDateTime::now_utc();
        let all = match self.registry.list_fresh().await {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "reading the registry at start failed");
                self.registry.list()
            }
        };
        for rec in all {
            if rec.state.is_usable() && rec.expires_at <= now {
                if let Err(e) = self.end(&rec.id, EndReason::Expired).await {
                    tracing::warn!(token = %rec.id, error = %e, "expiring token at start failed");
                }
            } else if rec.state.is_usable() {
                self.schedule_expiry(&rec);
            } else if rec.backend.is_some() {
                // Ended earlier but its backend outlived a crash: finish the job.
                if let Err(e) = self.destroy_backend(&rec.id).await {
                    tracing::warn!(token = %rec.id, error = %e, "destroying leftover backend failed");
                }
            }
        }
    }

    /// Check a token may open one more session now; returns the slot.
    pub fn acquire_session(&self, rec: &TokenRecord) -> Result<SessionSlot, u32> {
        let rt = self.runtime(&rec.id);
        let prev = rt.sessions.fetch_add(1, Ordering::AcqRel);
        if prev >= rec.caps.max_connections {
            rt.sessions.fetch_sub(1, Ordering::AcqRel);
            return Err(rec.caps.max_connections);
        }
        metrics::gauge!("sandpit_sessions").increment(1.0);
        metrics::counter!("sandpit_sessions_total").increment(1);
        Ok(SessionSlot(rt))
    }

    /// The running backend of a token: forked on first use (concurrent callers share one
    /// fork), restarted/adopted if the registry knows one from before.
    pub async fn backend_for(self: &Arc<Self>, id: &str) -> Result<Backend, LifecycleError> {
        let claim_started = std::time::Instant::now();
        let rt = self.runtime(id);
        let mut slot = rt.backend.lock().await;
        // Checked under the lock, so a fork can never start after the token ended.
        let rec = self
            .registry
            .lookup(id)
            .await?
            .ok_or_else(|| LifecycleError::Unknown(id.into()))?;
        if !rec.state.is_usable() {
            return Err(LifecycleError::NotUsable(id.into(), rec.state));
        }
        if let Some(b) = slot.as_ref() {
            let b = b.clone();
            // Before every session: a backend whose access was tampered with (a template
            // task role that changed its own password) ends its token.
            if let Err(ProviderError::Tampered(why)) = self.provider.check_access(&b.handle).await {
                drop(slot);
                return Err(self.end_tampered(id, &why).await);
            }
            return Ok(b);
        }
        // Across replicas: one fork per token. The record is read again under the lock, so
        // a backend another replica recorded meanwhile is adopted, not forked again.
        let _across = self.registry.lock_token(id).await?;
        let rec = self
            .registry
            .fresh(id)
            .await?
            .ok_or_else(|| LifecycleError::Unknown(id.into()))?;
        if !rec.state.is_usable() {
            return Err(LifecycleError::NotUsable(id.into(), rec.state));
        }
        self.schedule_expiry(&rec);
        if let Some(handle) = rec.backend.as_deref() {
            match self.provider.ensure_running(handle).await {
                Ok(b) => {
                    tracing::info!(token = %id, method = %b.method, "backend resumed");
                    metrics::gauge!("sandpit_backends").increment(1.0);
                    *slot = Some(b.clone());
                    return Ok(b);
                }
                Err(ProviderError::NotFound(_)) => {
                    tracing::warn!(token = %id, "backend vanished; forking a new one");
                }
                Err(ProviderError::Tampered(why)) => {
                    drop(_across);
                    drop(slot);
                    return Err(self.end_tampered(id, &why).await);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let tag = BackendTag {
            token_id: rec.id.clone(),
            task: rec.task.clone(),
            expires_at: rfc3339(rec.expires_at),
            gateway_id: self.gateway_id.clone(),
            golden: rec.golden.clone(),
        };
        self.room_to_fork(id)?;
        let started = std::time::Instant::now();
        // The parts of a first connection's claim: registry look-ups and locks, the
        // provider's fork (a warm-pool claim), recording the backend.
        claim_phase("claim_lock", claim_started, started);
        let b = self.provider.fork(&tag).await?;
        let took = started.elapsed();
        claim_phase("claim_provider", started, std::time::Instant::now());
        let record_started = std::time::Instant::now();
        self.hooks.forked(b.golden.clone());
        metrics::counter!("sandpit_forks_total", "method" => b.method.clone()).increment(1);
        metrics::histogram!("sandpit_fork_seconds", "method" => b.method.clone())
            .record(took.as_secs_f64());
        tracing::info!(token = %id, method = %b.method, netns = b.netns, ms = took.as_millis() as u64, "backend forked");
        let handle = b.handle.clone();
        let golden = b.golden.clone();
        let record = |r: &mut TokenRecord| {
            r.backend = Some(handle);
            r.golden = golden;
            r.fork_count += 1;
            // An end that raced the fork keeps its state; its destroy comes next.
            if r.state == TokenState::Issued {
                r.state = TokenState::Live;
            }
        };
        if self.provider.name() == "instance" {
            // An instance backend runs with fsync=off: a host crash loses its data anyway,
            // so its record may skip the directory sync (most of the first query's claim).
            // A crash that undoes it leaves the token unforked; the janitor reaps the
            // backend it named.
            self.registry.update_undoable(id, record).await?;
        } else {
            self.registry.update(id, record).await?;
        }
        claim_phase("claim_record", record_started, std::time::Instant::now());
        *slot = Some(b.clone());
        Ok(b)
    }

    /// End a token: mark it, end its sessions with the reason, destroy its backend.
    /// Returns false when it had ended already.
    pub async fn end(&self, id: &str, reason: EndReason) -> Result<bool, LifecycleError> {
        let new_state = match reason {
            EndReason::Expired => TokenState::Expired,
            EndReason::Revoked => TokenState::Revoked,
            EndReason::Shutdown => return Ok(false),
        };
        let mut changed = false;
        // Atomic across replicas: exactly one caller sees `changed` and destroys the backend.
        let rec = self
            .registry
            .update(id, |r| {
                if r.state.is_usable() {
                    r.state = new_state;
                    r.ended_at = Some(OffsetDateTime::now_utc());
                    changed = true;
                }
            })
            .await?;
        let Some(rec) = rec else {
            return Err(LifecycleError::Unknown(id.into()));
        };
        if !changed {
            // Ended a moment ago, perhaps by another replica: this replica's sessions end
            // now too, without waiting for the change feed.
            self.end_sessions_here(&rec);
            return Ok(false);
        }
        tracing::info!(token = %id, reason = ?reason, "token ended");
        metrics::counter!("sandpit_tokens_ended_total", "reason" => new_state.as_str())
            .increment(1);
        self.runtime(id).ended.send_replace(Some(reason));
        // Other replicas end their sessions of this token with the same reason; the review
        // and the destroy come after that (else an agent there would see the server's own
        // termination instead of why its token ended).
        self.await_sessions_elsewhere(id).await;
        {
            // The janitor takes this slot before it destroys a backend: held here, it cannot
            // reap this (already ended) token's backend while the hooks (review, validators,
            // the change kept for promotion) still read it.
            let rt = self.runtime(id);
            let _slot = rt.backend.lock().await;
            if let Some(rec) = self.registry.get(id) {
                // The review reads the log: the outcomes deferred by its sessions first.
                self.logs.flush(id);
                self.hooks.ending(&rec).await;
            }
        }
        self.logs.close(id);
        self.destroy_backend(id).await?;
        // Never forked: its pin alone may be keeping an old golden version.
        self.provider.unpin_golden(id).await?;
        Ok(true)
    }

    async fn destroy_backend(&self, id: &str) -> Result<(), LifecycleError> {
        let rt = self.runtime(id);
        let mut slot = rt.backend.lock().await;
        // After any fork in progress on another replica has recorded its handle.
        let _across = self.registry.lock_token(id).await?;
        let handle = self.registry.fresh(id).await?.and_then(|r| r.backend);
        if let Some(h) = handle {
            self.provider.destroy(&h).await?;
            metrics::counter!("sandpit_destroys_total").increment(1);
            slot.take();
            self.registry.update(id, |r| r.backend = None).await?;
        }
        Ok(())
    }
}

/// Milliseconds, saturating (Postgres takes at most i32::MAX ms).
fn ms(d: Duration) -> u64 {
    (d.as_millis() as u64).min(i32::MAX as u64)
}

/// One part of a first connection's claim, in `sandpit_first_query_phase_seconds`.
fn claim_phase(name: &'static str, from: std::time::Instant, to: std::time::Instant) {
    metrics::histogram!("sandpit_first_query_phase_seconds", "phase" => name)
        .record(to.duration_since(from).as_secs_f64());
}
