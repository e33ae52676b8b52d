//! A token's `max_connections` across fronts sharing the Postgres registry: each session is
//! recorded there (`registry::sessions`) when it is admitted, after this front's own count
//! let it through, and forgotten when it ends. A front that dies stops counting when its
//! lease runs out (`registry.session_lease`), renewed by `server` while the front runs.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::registry::postgres::PgStore;
use crate::registry::{RegistryError, TokenRecord};

/// This front's sessions in the shared registry.
pub struct FrontSessions {
    store: Arc<PgStore>,
    front: String,
    next: AtomicI64,
}

/// A session recorded in the shared registry; forgotten there when dropped.
pub struct SharedSlot {
    store: Arc<PgStore>,
    front: String,
    id: i64,
}

impl Drop for SharedSlot {
    fn drop(&mut self) {
        let (store, front, id) = (self.store.clone(), std::mem::take(&mut self.front), self.id);
        // A session ends on a task of the runtime; outside one (shutdown) the row stays and
        // stops counting with this front's lease.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = store.session_leave(&front, id).await {
                    tracing::warn!(error = %e, "cannot forget an ended session in the registry");
                }
            });
        }
    }
}

impl FrontSessions {
    /// This front's (`front`: its replica id) sessions in `store`.
    pub fn new(store: Arc<PgStore>, front: String) -> FrontSessions {
        FrontSessions {
            store,
            front,
            next: AtomicI64::new(1),
        }
    }

    /// Record a session of `rec` if the token has fewer than `max_connections` open on
    /// fronts whose lease is live; None when it has that many.
    pub async fn admit(&self, rec: &TokenRecord) -> Result<Option<SharedSlot>, RegistryError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let max = rec.caps.max_connections;
        if !self
            .store
            .session_admit(&rec.id, &self.front, id, max)
            .await?
        {
            return Ok(None);
        }
        Ok(Some(SharedSlot {
            store: self.store.clone(),
            front: self.front.clone(),
            id,
        }))
    }
}
