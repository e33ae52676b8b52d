//! Stopping backends without ending their tokens: idle suspend and graceful shutdown.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{EndReason, Gateway, TokenRuntime};

impl Gateway {
    /// Stop (keeping their data) the backends that had no session for `idle`; the next
    /// connection of the token starts them again. Returns how many were suspended.
    pub async fn suspend_idle(&self, idle: std::time::Duration) -> usize {
        let rts: Vec<(String, Arc<TokenRuntime>)> = self
            .runtimes
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        let mut suspended = 0;
        for (id, rt) in rts {
            let idle_for = rt
                .idle_since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed();
            if rt.sessions.load(Ordering::Acquire) > 0 || idle_for < idle {
                continue;
            }
            let mut slot = rt.backend.lock().await;
            // Checked again under the lock: a session that arrived meanwhile waits on it and
            // will find the backend gone, and start it again.
            if rt.sessions.load(Ordering::Acquire) > 0 {
                continue;
            }
            let Some(b) = slot.take() else { continue };
            match self.provider.stop(&b.handle).await {
                Ok(()) => {
                    suspended += 1;
                    metrics::gauge!("sandpit_backends").decrement(1.0);
                    metrics::counter!("sandpit_suspends_total").increment(1);
                    tracing::info!(token = %id, idle_s = idle_for.as_secs(), "backend suspended while idle");
                }
                Err(e) => {
                    tracing::warn!(token = %id, error = %e, "suspending idle backend failed");
                    *slot = Some(b);
                }
            }
        }
        suspended
    }

    /// Graceful shutdown: end every session with 57P01 and stop (not destroy) every running
    /// backend; they start again lazily on the next connection after a restart. Returns
    /// how many backends it stopped.
    pub async fn shutdown(&self) -> usize {
        let rts: Vec<(String, Arc<TokenRuntime>)> = self
            .runtimes
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        for (_, rt) in &rts {
            rt.ended.send_replace(Some(EndReason::Shutdown));
        }
        // In parallel: each stop waits for its server's shutdown checkpoint.
        let mut stops = tokio::task::JoinSet::new();
        for (id, rt) in rts {
            let provider = self.provider.clone();
            stops.spawn(async move {
                let mut slot = rt.backend.lock().await;
                let Some(b) = slot.take() else { return false };
                if let Err(e) = provider.stop(&b.handle).await {
                    tracing::warn!(token = %id, error = %e, "stopping backend failed");
                    return false;
                }
                true
            });
        }
        let mut stopped = 0;
        while let Some(r) = stops.join_next().await {
            stopped += usize::from(r.unwrap_or(false));
        }
        if let Err(e) = self.provider.release_reference().await {
            tracing::warn!(error = %e, "removing the review reference backend failed");
        }
        stopped
    }
}
