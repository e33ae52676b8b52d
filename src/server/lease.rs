//! This front's lease in the shared registry: taken before it serves (after forgetting the
//! session rows an earlier run of it left), renewed every third of `registry.session_lease`
//! until it stops, removing stale rows of the fleet-wide limits (`registry::limits`) as it does. Sessions count towards a token's `max_connections` across fronts only
//! while their front's lease is live (see `registry::sessions`).

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::registry::postgres::PgStore;
use crate::registry::RegistryError;

/// Takes the lease, then renews it on a task until `stop` turns true.
pub async fn start(
    store: Arc<PgStore>,
    front: String,
    ttl: std::time::Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, RegistryError> {
    store.sessions_schema().await?;
    store.limits_schema().await?;
    let left = store.sessions_forget_front(&front).await?;
    if left > 0 {
        tracing::info!(
            left,
            "session records left by this front's last run removed"
        );
    }
    store.lease_renew(&front, ttl).await?;
    Ok(tokio::spawn(async move {
        let every = (ttl / 3).max(std::time::Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
            if let Err(e) = store.lease_renew(&front, ttl).await {
                // Past the lease this front's sessions stop counting elsewhere; said loudly.
                tracing::warn!(error = %e, "cannot renew this front's session lease");
            }
            // Each front removes stale limit rows as it renews: cheap (two indexed deletes
            // every third of a lease), and no front is needed for it in particular.
            if let Err(e) = store.limits_forget_stale().await {
                tracing::debug!(error = %e, "cannot forget stale limit rows");
            }
        }
    }))
}
