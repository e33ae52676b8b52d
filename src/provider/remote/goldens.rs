//! Golden versions on a front over sandpit workers (`remote.urls`): the worker extension of
//! `docs/remote-provider.yaml` (`/v1/goldens…`). A build runs on every worker at once under
//! one id the front chooses, so an id names the same content everywhere; `use` is refused
//! unless every worker has the version ready, so the fleet is never half switched by it. A
//! service without the extension (404) keeps the answer of providers without versions.
//! Tokens are not pinned at issue: a token's version is the one its worker has in use when
//! its sandbox is made (its first connection), and the worker reports it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use reqwest::{Method, StatusCode};

use super::set::RemoteSet;
use super::{api, remote, RemoteProvider};
use crate::provider::golden::live::LiveSpec;
use crate::provider::golden::store::{self, GoldenInfo, WorkerVersion};
use crate::provider::{BoxFuture, GoldenVersions, ProviderError};

/// How long one worker may take to build a version (a copy of the whole source database).
const BUILD_TIMEOUT: Duration = Duration::from_secs(3600);
/// Largest answer read from a golden route.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// The answer of a service without the extension.
fn unsupported(url: &str) -> ProviderError {
    ProviderError::Unsupported(format!(
        "golden versions need sandpit workers that offer /v1/goldens; {url} does not (HTTP 404): \
         golden build, list and use are not available with this remote provider"
    ))
}

impl RemoteProvider {
    /// One golden request, no retries (a retried build would build twice); None: 404.
    async fn golden_call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&api::BuildGolden>,
        within: Duration,
    ) -> Result<Option<T>, ProviderError> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .timeout(within);
        if let Some(k) = &self.cfg.api_key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        // The error of reqwest names the URL, never the body (where the DSN is).
        let mut resp = req
            .send()
            .await
            .map_err(|e| remote(format!("{method} {path}: {e}")))?;
        let status = resp.status();
        let mut buf = Vec::new();
        while let Some(c) = resp
            .chunk()
            .await
            .map_err(|e| remote(format!("{method} {path}: {e}")))?
        {
            if buf.len() + c.len() > MAX_BODY {
                return Err(remote(format!("{method} {path}: response too large")));
            }
            buf.extend_from_slice(&c);
        }
        if status == StatusCode::NOT_FOUND && path == "/v1/goldens" {
            return Ok(None);
        }
        if !status.is_success() {
            let msg = serde_json::from_slice::<api::ApiError>(&buf)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&buf[..buf.len().min(200)]).into());
            if status == StatusCode::NOT_FOUND {
                return Err(ProviderError::NotFound(msg));
            }
            return Err(remote(format!("{method} {path}: HTTP {status}: {msg}")));
        }
        serde_json::from_slice(&buf)
            .map(Some)
            .map_err(|source| ProviderError::RemoteJson {
                what: format!("{method} {path}: bad response"),
                source,
            })
    }

    async fn worker_goldens(&self) -> Result<Option<Vec<GoldenInfo>>, ProviderError> {
        let within = self.cfg.request_timeout;
        let list: Option<api::GoldenList> = self
            .golden_call(Method::GET, "/v1/goldens", None, within)
            .await?;
        Ok(list.map(|l| l.goldens))
    }
}

/// Every worker's versions merged by id: `workers` says where each is ready, `active` is
/// true when it is active on every worker that has it, `forks` is summed.
fn merge(per_worker: Vec<(usize, String, Vec<GoldenInfo>)>) -> Vec<GoldenInfo> {
    let mut by_id: BTreeMap<String, GoldenInfo> = BTreeMap::new();
    let mut order = Vec::new();
    for (n, url, goldens) in per_worker {
        for g in goldens {
            let here = WorkerVersion {
                worker: n,
                url: url.clone(),
                active: g.active,
                forks: g.forks,
            };
            match by_id.get_mut(&g.id) {
                Some(m) => {
                    m.active &= g.active;
                    m.forks += g.forks;
                    m.workers.push(here);
                }
                None => {
                    order.push(g.id.clone());
                    let mut m = g;
                    m.workers = vec![here];
                    by_id.insert(m.id.clone(), m);
                }
            }
        }
    }
    order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect()
}

impl RemoteSet {
    /// Each worker's versions, in `remote.urls` order; a worker without the extension makes
    /// it Unsupported.
    async fn all_goldens(&self) -> Vec<(usize, String, Result<Vec<GoldenInfo>, ProviderError>)> {
        let asks = self
            .members()
            .iter()
            .enumerate()
            .map(|(n, (url, p))| async move {
                let got = match p.worker_goldens().await {
                    Ok(Some(g)) => Ok(g),
                    Ok(None) => Err(unsupported(url)),
                    Err(e) => Err(self.named(n, e)),
                };
                (n, url.clone(), got)
            });
        join_all(asks).await
    }

    async fn list_goldens(&self) -> Result<Vec<GoldenInfo>, ProviderError> {
        let mut ok = Vec::new();
        for (n, url, got) in self.all_goldens().await {
            match got {
                Ok(g) => ok.push((n, url, g)),
                Err(e @ ProviderError::Unsupported(_)) => return Err(e),
                // A silent worker is left out: the listing says where versions are ready.
                Err(e) => {
                    tracing::warn!(worker = n, error = %e, "listing golden versions failed on this worker")
                }
            }
        }
        Ok(merge(ok))
    }

    async fn build_everywhere(&self, spec: &LiveSpec) -> Result<GoldenInfo, ProviderError> {
        let id = spec.id.clone().unwrap_or_else(store::new_id);
        let body = api::BuildGolden {
            id: id.clone(),
            from_dsn: spec.source.to_dsn(),
            schemas: spec.schemas.clone(),
            exclude_tables: spec.exclude_tables.clone(),
            mask: spec.mask_text.clone(),
        };
        tracing::info!(golden = %id, source = %spec.source.describe(), workers = self.members().len(), "building a golden version on every worker");
        let builds = self.members().iter().enumerate().map(|(n, (url, p))| {
            let body = &body;
            async move {
                let got = p
                    .golden_call::<GoldenInfo>(
                        Method::POST,
                        "/v1/goldens",
                        Some(body),
                        BUILD_TIMEOUT,
                    )
                    .await;
                (n, url.clone(), got)
            }
        });
        let mut failures = Vec::new();
        for (n, url, got) in join_all(builds).await {
            match got {
                Ok(Some(_)) => {
                    tracing::info!(golden = %id, worker = n, "golden version built on this worker")
                }
                Ok(None) => failures.push(unsupported(&url).to_string()),
                Err(e) => failures.push(self.named(n, e).to_string()),
            }
        }
        let listed = self.list_goldens().await?;
        let info = listed.into_iter().find(|g| g.id == id);
        match (failures.is_empty(), info) {
            (true, Some(g)) => Ok(g),
            (_, info) => {
                let ready: Vec<String> = info
                    .map(|g| g.workers.iter().map(|w| w.worker.to_string()).collect())
                    .unwrap_or_default();
                Err(remote(format!(
                    "golden {id} was not built on every worker (ready on workers [{}]; `golden use` refuses it until every worker has it): {}",
                    ready.join(", "),
                    failures.join("; ")
                )))
            }
        }
    }

    /// Refuses unless every worker has `id` ready, then switches each.
    async fn use_everywhere(&self, id: &str) -> Result<GoldenInfo, ProviderError> {
        let mut lacking = Vec::new();
        for (n, url, got) in self.all_goldens().await {
            match got {
                Ok(g) if g.iter().any(|v| v.id == id) => {}
                Ok(_) => lacking.push(format!("worker {n} ({url}) has no golden {id}")),
                Err(e @ ProviderError::Unsupported(_)) => return Err(e),
                Err(e) => lacking.push(format!("{e} (cannot tell whether it has golden {id})")),
            }
        }
        if !lacking.is_empty() {
            return Err(ProviderError::Refused(format!(
                "golden {id} is not in use anywhere: not every worker has it ready ({}); build it again with `golden build` so every worker has the same version",
                lacking.join("; ")
            )));
        }
        for (n, (_, p)) in self.members().iter().enumerate() {
            let path = format!("/v1/goldens/{}/use", super::http::url_encode(id));
            p.golden_call::<GoldenInfo>(Method::POST, &path, None, p.cfg.request_timeout)
                .await
                .map_err(|e| self.named(n, e))?;
        }
        tracing::info!(golden = %id, "golden version in use on every worker");
        self.list_goldens()
            .await?
            .into_iter()
            .find(|g| g.id == id)
            .ok_or_else(|| ProviderError::NotFound(format!("golden {id}")))
    }
}

impl GoldenVersions for RemoteSet {
    fn goldens(&self) -> BoxFuture<'_, Result<Vec<GoldenInfo>, ProviderError>> {
        Box::pin(self.list_goldens())
    }

    fn build_golden<'a>(
        &'a self,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(self.build_everywhere(spec))
    }

    fn use_golden<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(self.use_everywhere(id))
    }

    fn active_golden(&self) -> String {
        // Only a warm pool asks, and a front keeps none: the workers know theirs.
        String::new()
    }

    fn pin_golden<'a>(
        &'a self,
        _token: &'a str,
        _expires_at: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        // Known once the worker forks (module doc).
        Box::pin(async { Ok(None) })
    }

    fn unpin_golden<'a>(&'a self, _token: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
}
