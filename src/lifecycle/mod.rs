//! The life of a token: issue, lazy single-flight fork, TTL expiry, revoke. Ending a token
//! ends its sessions (they see the reason), destroys its backend, and marks the record.

mod adopt;
mod ending;
mod faults;
mod issue;
mod issue_check;
pub mod janitor;
pub mod lost;
pub mod pace;
mod reap_report;
mod replicas;
mod stop;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use time::OffsetDateTime;
use tokio::sync::{watch, Mutex};

use crate::auth::ratelimit::AuthLimiter;
use crate::config::Config;
use crate::journal::log::LogBook;
use crate::provider::{Backend, BackendTag, BoxFuture, Provider, ProviderError};
use crate::registry::{Registry, RegistryError, TokenRecord, TokenState};
use crate::rfc3339::format as rfc3339;

pub use adopt::Adopted;
pub use issue::{IssueRequest, TokenView};

/// Why a token stopped being usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// TTL passed.
    Expired,
    /// Revoked by the harness.
    Revoked,
    /// Revoked because the worker holding its backend was lost (`remote.worker_lost_after`).
    WorkerLost,
    /// The gateway is shutting down (token stays valid).
    Shutdown,
}

impl EndReason {
    /// Message the client sees.
    pub fn message(self) -> &'static str {
        match self {
            EndReason::Expired => "terminating connection because the sandpit token expired",
            EndReason::Revoked => "terminating connection because the sandpit token was revoked",
            EndReason::WorkerLost => {
                "terminating connection because the sandpit token was revoked: \
                 the worker holding its scratch database was lost"
            }
            EndReason::Shutdown => {
                "terminating connection because the sandpit gateway is shutting down"
            }
        }
    }
}

/// What happens around a token's life that the lifecycle does not own (the review), set up
/// by `server/run.rs`: the lifecycle calls these and never imports the modules above it.
pub trait TokenHooks: Send + Sync + 'static {
    /// A token was just issued (its record written).
    fn issued(&self, _rec: &TokenRecord) {}
    /// An ended token's scratch data was discarded without a stored review.
    fn discarded(&self, _rec: &TokenRecord) {}
    /// A backend was just forked for a token, from golden version `golden`.
    fn forked(&self, golden: Option<String>);
    /// A token ended; called before its backend is destroyed. An error (why the review
    /// could not be stored) keeps the backend for the next try.
    fn ending<'a>(&'a self, rec: &'a TokenRecord) -> BoxFuture<'a, Result<(), String>>;
}

/// Hooks that do nothing.
pub struct NoHooks;

impl TokenHooks for NoHooks {
    fn forked(&self, _golden: Option<String>) {}
    fn ending<'a>(&'a self, _rec: &'a TokenRecord) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
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
    /// A step the end of the token does not allow now.
    #[error(transparent)]
    End(crate::registry::end::EndError),
}

/// Runtime state of one token in this process.
pub struct TokenRuntime {
    backend: Mutex<Option<Backend>>,
    sessions: AtomicU32,
    ended: watch::Sender<Option<EndReason>>,
    /// When the last session ended (for idle suspend).
    idle_since: std::sync::Mutex<std::time::Instant>,
    /// The pace of its new sessions (made on the first login, from `[limits]`).
    pace: std::sync::Mutex<Option<pace::Pace>>,
}

impl TokenRuntime {
    fn new() -> Self {
        TokenRuntime {
            backend: Mutex::new(None),
            sessions: AtomicU32::new(0),
            ended: watch::channel(None).0,
            idle_since: std::sync::Mutex::new(std::time::Instant::now()),
            pace: std::sync::Mutex::new(None),
        }
    }

    /// A receiver that fires when the token ends.
    pub fn ended(&self) -> watch::Receiver<Option<EndReason>> {
        self.ended.subscribe()
    }
}

/// Holds one session slot of a token; frees it on drop.
pub struct SessionSlot(Arc<TokenRuntime>);

impl SessionSlot {
    /// How many sessions the token has open now (this one included).
    pub fn token_sessions(&self) -> u32 {
        self.0.sessions.load(Ordering::Relaxed)
    }
}

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
    /// Tokens whose end (review, destroy) runs in this process now.
    ending: DashMap<String, ()>,
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
            ending: DashMap::new(),
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
            } else if crate::registry::end::needs_review(&rec) {
                // Its end was cut short (a crash): the janitor's pass at start finishes it.
                tracing::info!(token = %rec.id, "token ended without a stored review; the janitor takes it");
            } else if rec.backend.is_some()
                || matches!(
                    rec.end,
                    Some(
                        crate::registry::end::EndPhase::Reviewed
                            | crate::registry::end::EndPhase::Discarded
                    )
                )
            {
                // Ended earlier but its end outlived a crash (a backend left, a destroy not
                // recorded): finish the job.
                if let Err(e) = self.finish_end(&rec.id).await {
                    tracing::warn!(token = %rec.id, error = %e, "destroying leftover backend failed");
                }
            }
        }
    }

    /// When a new session of a token that authenticated may start its backend login
    /// (`limits.sessions_per_second` after `limits.session_burst`), waiting at most `max_wait`.
    /// With a shared registry the pace is the fleet's (one statement there per login); if the
    /// registry fails, this front's own pace decides (a login is not refused for it, nor let
    /// through unpaced).
    pub async fn pace_session(&self, id: &str, max_wait: Duration) -> pace::Turn {
        let limits = &self.config.limits;
        if let (Some(store), true) = (self.registry.shared(), limits.sessions_per_second > 0) {
            let (interval, tolerance) =
                pace::params(limits.sessions_per_second, limits.session_burst);
            match store.pace_admit(id, interval, tolerance, max_wait).await {
                Ok(wait) => return pace::Turn::from_wait(wait),
                Err(e) => {
                    metrics::counter!("sandpit_registry_limit_errors_total", "limit" => "pace")
                        .increment(1);
                    tracing::warn!(token = %id, error = %e, "fleet pace unavailable: this front's pace decides");
                }
            }
        }
        let rt = self.runtime(id);
        let mut p = rt.pace.lock().unwrap_or_else(|p| p.into_inner());
        p.get_or_insert_with(|| pace::Pace::new(limits.sessions_per_second, limits.session_burst))
            .admit(std::time::Instant::now(), max_wait)
    }

    /// Count one failed authentication against `key`; true when the key was already over
    /// `limits.auth_failures_per_minute`. With a shared registry the fleet's count decides
    /// (one statement there per failure); this front's count is kept as well and decides
    /// when the registry fails, so a registry outage never lifts the limit (each front
    /// then limits on its own), and never refuses a correct secret either (only failures
    /// come here).
    pub async fn auth_failed(&self, key: &crate::auth::ratelimit::Key) -> bool {
        let local = self.auth_limiter.failed(key);
        let per_minute = self.auth_limiter.per_minute();
        let Some(store) = self.registry.shared().filter(|_| per_minute > 0) else {
            return local;
        };
        match store.auth_failed(&key.spelling(), per_minute).await {
            Ok(over) => over,
            Err(e) => {
                metrics::counter!("sandpit_registry_limit_errors_total", "limit" => "auth")
                    .increment(1);
                tracing::warn!(error = %e, "fleet auth-failure count unavailable: this front's count decides");
                local
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
        crate::registry::end::crash_point("claim:taken");
        let took = started.elapsed();
        claim_phase("claim_provider", started, std::time::Instant::now());
        let record_started = std::time::Instant::now();
        self.hooks.forked(b.golden.clone());
        metrics::counter!("sandpit_forks_total", "method" => b.method.clone()).increment(1);
        metrics::histogram!("sandpit_fork_seconds", "method" => b.method.clone())
            .record(took.as_secs_f64());
        tracing::info!(token = %id, method = %b.method, netns = b.netns, ms = took.as_millis() as u64, "backend forked");
        if self.provider.claims_by_record() {
            if let Err(e) = self.record_claim(id, &b, tag).await {
                // Not recorded, and (a pool member) still tagged as the pool's: nobody's.
                if let Err(e2) = self.provider.destroy(&b.handle).await {
                    tracing::warn!(handle = %b.handle, error = %e2, "destroying an unrecorded claim failed");
                }
                return Err(e);
            }
        } else {
            let (handle, golden) = (b.handle.clone(), b.golden.clone());
            self.registry
                .update(id, |r| crate::registry::claims::claim(r, &handle, golden))
                .await?;
        }
        claim_phase("claim_record", record_started, std::time::Instant::now());
        *slot = Some(b.clone());
        Ok(b)
    }

    /// Record a claim with no disk sync on the first query's path (providers whose claims
    /// the registry records alone): one journal line now; its sync (shared with claims
    /// made meanwhile) and the member's new tag follow in the background. A crash before
    /// the line leaves the member the pool's (destroyed at start), after it the token's
    /// (the pool skips it at start and re-tags it).
    async fn record_claim(
        self: &Arc<Self>,
        id: &str,
        b: &Backend,
        tag: BackendTag,
    ) -> Result<(), LifecycleError> {
        let (_, ticket) = self
            .registry
            .claim(id, &b.handle, b.golden.clone())
            .await?
            .ok_or_else(|| LifecycleError::Unknown(id.into()))?;
        crate::registry::end::crash_point("claim:journaled");
        let gw = self.clone();
        let handle = b.handle.clone();
        tokio::spawn(async move {
            if let Err(e) = gw.registry.commit_claim(ticket).await {
                tracing::warn!(token = %tag.token_id, error = %e, "syncing a claim failed; a host crash may undo it");
            }
            crate::registry::end::crash_point("claim:committed");
            if handle.starts_with(crate::provider::pool::POOL_PREFIX) {
                // The tag is the janitor's hint after a crash; the registry names the owner.
                if let Err(e) = gw.provider.retag(&handle, &tag).await {
                    tracing::debug!(handle, error = %e, "re-tagging a claimed pool member failed");
                }
                crate::registry::end::crash_point("claim:retagged");
            }
        });
        Ok(())
    }

    /// End a token: mark it, end its sessions with the reason, destroy its backend.
    /// Returns false when it had ended already.
    pub async fn end(&self, id: &str, reason: EndReason) -> Result<bool, LifecycleError> {
        let new_state = match reason {
            EndReason::Expired => TokenState::Expired,
            EndReason::Revoked | EndReason::WorkerLost => TokenState::Revoked,
            EndReason::Shutdown => return Ok(false),
        };
        let mut changed = false;
        // Atomic across replicas: exactly one caller sees `changed` and destroys the backend.
        let rec = self
            .registry
            .update(id, |r| {
                if r.state.is_usable() {
                    crate::registry::end::begin(r, new_state);
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
        crate::registry::end::crash_point("end:marked");
        metrics::counter!("sandpit_tokens_ended_total", "reason" => new_state.as_str())
            .increment(1);
        self.runtime(id).ended.send_replace(Some(reason));
        // Other replicas end their sessions of this token with the same reason; the review
        // and the destroy come after that (else an agent there would see the server's own
        // termination instead of why its token ended).
        self.await_sessions_elsewhere(id).await;
        crate::registry::end::crash_point("end:sessions_ended");
        // A review that fails keeps the backend; the janitor tries again.
        self.finish_end(id).await?;
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
            crate::registry::end::crash_point("end:backend_destroyed");
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
