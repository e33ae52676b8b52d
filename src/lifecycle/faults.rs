//! A token's backend in trouble: its access tampered with, its server crashed, no room on
//! disk for a fork.

use super::{EndReason, Gateway, LifecycleError};
use crate::provider::ProviderError;
use crate::registry::TokenState;

impl Gateway {
    /// A token whose backend access was tampered with is revoked (its sessions end, its
    /// backend goes); the error for the connection that found it.
    pub async fn end_tampered(&self, id: &str, why: &str) -> LifecycleError {
        tracing::warn!(token = %id, why, "backend access tampered with; revoking the token");
        metrics::counter!("sandpit_tokens_tampered_total").increment(1);
        if let Err(e) = self.end(id, EndReason::Revoked).await {
            tracing::warn!(token = %id, error = %e, "revoking a tampered token failed");
        }
        LifecycleError::NotUsable(id.into(), TokenState::Revoked)
    }

    /// Forget the cached backend of a token whose connection failed (its server may have
    /// crashed): the next `backend_for` checks it again, restarting it if it is down.
    pub async fn backend_failed(&self, id: &str) {
        if let Some(rt) = self.runtimes.get(id).map(|r| r.clone()) {
            if rt.backend.lock().await.take().is_some() {
                metrics::gauge!("sandpit_backends").decrement(1.0);
            }
        }
    }

    /// A fork copies a golden: refused before anything is copied while the data dir's
    /// filesystem is nearly full (statement logs and token records need the room more).
    pub(super) fn room_to_fork(&self, id: &str) -> Result<(), LifecycleError> {
        let min_free = self.config.limits.min_free_bytes;
        if min_free == 0 {
            return Ok(());
        }
        match crate::datadir::free_bytes(&self.config.data_dir) {
            Some(free) if free < min_free => {
                metrics::counter!("sandpit_forks_refused_low_disk_total").increment(1);
                tracing::error!(token = %id, free, min_free, "fork refused: the data dir's filesystem is nearly full");
                Err(LifecycleError::Provider(ProviderError::NotReady(format!(
                    "data dir has {free} bytes free, below limits.min_free_bytes ({min_free})"
                ))))
            }
            _ => Ok(()),
        }
    }
}
