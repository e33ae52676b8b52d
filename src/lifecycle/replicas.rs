//! Following the other replicas that share the Postgres registry.

use std::sync::Arc;

use time::OffsetDateTime;

use super::{EndReason, Gateway, LifecycleError, TokenRuntime};
use crate::provider::Backend;
use crate::registry::{TokenRecord, TokenState};

/// Longest wait for other replicas to end an ended token's sessions (they learn of the end
/// by NOTIFY within milliseconds; a dead replica's leftover keys must not hold a revoke).
const SESSIONS_END_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Gateway {
    /// Follows changes other replicas make to the shared registry: a token ended elsewhere
    /// ends its sessions here (57P01, as if ended here) and forgets its backend; a token
    /// issued elsewhere gets its expiry timer here too. No-op for the file registry.
    pub fn follow_replicas(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let mut changes = self.registry.take_changes()?;
        let gw = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            while let Some(rec) = changes.recv().await {
                let Some(gw) = gw.upgrade() else { break };
                gw.absorb_remote(rec);
            }
        }))
    }

    fn absorb_remote(self: &Arc<Self>, rec: TokenRecord) {
        if rec.state.is_usable() {
            if rec.expires_at > OffsetDateTime::now_utc() {
                self.schedule_expiry(&rec);
            }
            return;
        }
        let Some(rt) = self.end_sessions_here(&rec) else {
            return;
        };
        // The replica that ended it destroys the backend; here it is only forgotten.
        tokio::spawn(async move {
            rt.backend.lock().await.take();
        });
    }

    /// A token that ended elsewhere (or a moment ago, by another caller): its sessions on
    /// this replica end with its reason, once. Its runtime, if this replica has one.
    pub(super) fn end_sessions_here(&self, rec: &TokenRecord) -> Option<Arc<TokenRuntime>> {
        let reason = match rec.state {
            TokenState::Issued | TokenState::Live => return None,
            TokenState::Expired => EndReason::Expired,
            TokenState::Revoked if rec.ended_why.is_some() => EndReason::WorkerLost,
            TokenState::Revoked => EndReason::Revoked,
        };
        let rt = self.runtimes.get(&rec.id).map(|r| r.clone())?;
        if rt.ended.borrow().is_none() {
            tracing::info!(token = %rec.id, reason = ?reason, "token ended on another replica");
            rt.ended.send_replace(Some(reason));
            self.logs.close(&rec.id);
        }
        Some(rt)
    }

    /// After a token ended here: wait (bounded) until no replica holds a session of it, so
    /// that each replica's sessions are told "expired"/"revoked" before the backend is
    /// destroyed. A replica that died leaves keys behind; the deadline covers that.
    pub(super) async fn await_sessions_elsewhere(&self, id: &str) {
        let Some(store) = self.registry.shared() else {
            return;
        };
        let deadline = tokio::time::Instant::now() + SESSIONS_END_WAIT;
        loop {
            match store.open_sessions(id).await {
                Ok(0) => return,
                Ok(n) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!(token = %id, sessions = n, "sessions of an ended token still recorded; destroying its backend anyway");
                    return;
                }
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(25)).await,
                Err(e) => {
                    tracing::warn!(token = %id, error = %e, "cannot count an ended token's sessions");
                    return;
                }
            }
        }
    }

    /// The token's backend if it has one, never forking: a cancel minted by another replica
    /// is delivered through it. None when the token is unknown, ended or has no backend.
    pub async fn running_backend(&self, id: &str) -> Result<Option<Backend>, LifecycleError> {
        let rt = self.runtime(id);
        if let Some(b) = rt.backend.lock().await.as_ref() {
            return Ok(Some(b.clone()));
        }
        let Some(rec) = self.registry.lookup(id).await? else {
            return Ok(None);
        };
        let Some(handle) = rec.backend.filter(|_| rec.state.is_usable()) else {
            return Ok(None);
        };
        Ok(Some(self.provider.ensure_running(&handle).await?))
    }
}
