//! Adoption at start: scratch servers a killed gateway left running become known to this
//! one, so idle suspend and graceful shutdown stop them like any other, and the sessions the
//! dead gateway relayed (their backends may still be busy in a statement) are ended.

use std::sync::Arc;

use super::Gateway;

/// What adoption at start did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Adopted {
    /// Running servers of live tokens now held by this gateway.
    pub servers: usize,
    /// Client sessions of the dead gateway ended on them.
    pub stale_sessions: u64,
}

impl Gateway {
    /// Takes every running server of a live token into its token's runtime (unless the
    /// runtime already has one), and ends the client sessions left on it. Run at start,
    /// before the gateway accepts connections, so every session on an adopted server is
    /// one of the dead gateway's. Per-server failures are logged and skipped.
    pub async fn adopt_running(self: &Arc<Self>) -> Adopted {
        let mut done = Adopted::default();
        for rec in self.registry.list() {
            let Some(handle) = rec.backend.as_deref() else {
                continue;
            };
            // Only servers the provider sees running here: a stopped one starts lazily on
            // the next connection, and providers that cannot tell have nothing to adopt.
            if !rec.state.is_usable() || self.provider.server_running(handle) != Some(true) {
                continue;
            }
            let rt = self.runtime(&rec.id);
            let mut slot = rt.backend.lock().await;
            if slot.is_some() {
                continue;
            }
            let b = match self.provider.ensure_running(handle).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(token = %rec.id, error = %e, "adopting a running scratch server failed");
                    continue;
                }
            };
            match self.provider.end_stale_sessions(handle).await {
                Ok(n) => done.stale_sessions += n,
                // Still adopted: shutdown and idle suspend stop it, which ends them too.
                Err(e) => {
                    tracing::warn!(token = %rec.id, error = %e, "ending stale sessions failed")
                }
            }
            // Idle from now: suspended after `idle_suspend` unless a session comes.
            *rt.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
            tracing::info!(token = %rec.id, method = %b.method, "running scratch server adopted");
            *slot = Some(b);
            done.servers += 1;
        }
        done
    }
}
