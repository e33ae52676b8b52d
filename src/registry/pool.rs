//! The shared registry's connections on one front: at most `max` run queries at once (the
//! rest wait up to `wait`, then fail with [`RegistryError::Busy`] instead of opening one more
//! TLS + SCRAM connection per query under load), and up to `max` idle ones are kept for
//! reuse. Advisory locks borrow an idle connection when there is one and give it back once
//! unlocked; they do not take a query slot, since a lock holder goes on to query (a fork
//! holds its token's lock while it records the backend) and would otherwise wait on itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::Client;

use super::RegistryError;

/// How many registry connections a front uses for queries, and how long a query waits for one.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Connections running queries at once (at least 1).
    pub max: usize,
    /// The longest a query waits for one before failing with `Busy`.
    pub wait: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            max: 16,
            wait: Duration::from_secs(5),
        }
    }
}

/// Idle connections, shared with lock guards (which give theirs back from a task).
#[derive(Clone)]
pub struct Idle {
    conns: Arc<Mutex<Vec<Client>>>,
    keep: usize,
}

impl Idle {
    /// A connection that is still open, if one is idle.
    pub fn take(&self) -> Option<Client> {
        let mut idle = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(c) = idle.pop() {
            if !c.is_closed() {
                return Some(c);
            }
        }
        None
    }

    /// Keep `c` for reuse unless it broke or enough are idle already.
    pub fn give_back(&self, c: Client) {
        if c.is_closed() {
            return;
        }
        let mut idle = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.keep {
            idle.push(c);
        }
    }

    /// How many are idle now.
    pub fn count(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The query slots and the idle connections.
pub struct Pool {
    slots: Arc<Semaphore>,
    limits: PoolLimits,
    idle: Idle,
}

impl Pool {
    /// A pool of `limits.max` query slots (0 is taken as 1).
    pub fn new(limits: PoolLimits) -> Pool {
        let max = limits.max.max(1);
        Pool {
            slots: Arc::new(Semaphore::new(max)),
            limits: PoolLimits { max, ..limits },
            idle: Idle {
                conns: Arc::new(Mutex::new(Vec::with_capacity(max))),
                keep: max,
            },
        }
    }

    /// A query slot, waiting up to the pool's `wait` for one to free up.
    pub async fn slot(&self) -> Result<OwnedSemaphorePermit, RegistryError> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        match tokio::time::timeout(self.limits.wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            // The semaphore is never closed; a closed one means the pool is going away.
            Ok(Err(_)) | Err(_) => {
                metrics::counter!("sandpit_registry_busy_total").increment(1);
                Err(RegistryError::Busy {
                    max: self.limits.max,
                    waited: self.limits.wait,
                })
            }
        }
    }

    /// The idle connections.
    pub fn idle(&self) -> &Idle {
        &self.idle
    }

    /// Query slots in use now.
    pub fn busy(&self) -> usize {
        self.limits.max - self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short: the test waits it out for real (a lower bound, never an upper one).
    const WAIT: Duration = Duration::from_millis(50);

    fn pool(max: usize) -> Pool {
        Pool::new(PoolLimits { max, wait: WAIT })
    }

    #[tokio::test]
    async fn a_query_past_the_limit_waits_then_is_told_busy() {
        let p = pool(2);
        let a = p.slot().await.expect("first");
        let _b = p.slot().await.expect("second");
        assert_eq!(p.busy(), 2);
        let t0 = tokio::time::Instant::now();
        match p.slot().await {
            Err(RegistryError::Busy { max: 2, waited }) => {
                assert_eq!(waited, WAIT)
            }
            other => panic!("expected Busy, got {:?}", other.map(|_| ())),
        }
        assert!(t0.elapsed() >= WAIT);
        drop(a);
        assert_eq!(p.busy(), 1);
        let _again = p.slot().await.expect("a slot freed by a finished query");
    }

    #[tokio::test]
    async fn a_waiting_query_gets_the_slot_a_finished_one_frees() {
        // A wait no scheduling delay reaches: the slot must come from the drop.
        let p = Arc::new(Pool::new(PoolLimits {
            max: 1,
            wait: Duration::from_secs(600),
        }));
        let held = p.slot().await.expect("first");
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.slot().await.map(|_| ()) }
        });
        tokio::time::sleep(WAIT / 5).await;
        drop(held);
        assert!(waiter.await.expect("join").is_ok());
    }

    #[test]
    fn a_limit_of_zero_is_one() {
        let p = pool(0);
        assert_eq!(p.limits.max, 1);
        assert_eq!(p.busy(), 0);
        assert_eq!(p.idle().count(), 0);
    }
}
