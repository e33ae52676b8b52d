//! The warm pool's filler: a background task that forks members toward the target (one at a
//! time when nobody is waiting, up to the cores when first connections wait or the pool
//! grows under demand), offers each to the oldest waiting first connection or the ready
//! queue, and shrinks the pool back as the demand decays.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{WarmPool, POOL_PREFIX};
use crate::provider::pool_sizing::{next_step, Step};
use crate::provider::{Backend, BackendTag};

/// Pause between a claim and the refill it triggers (restarted by each further claim).
const REFILL_DELAY: Duration = Duration::from_millis(500);
/// Longest a stream of claims holds the refill back.
const REFILL_HOLD_MAX: Duration = Duration::from_secs(5);
/// Longest wait before the filler looks at a grown pool again (its demand decays meanwhile).
const RECHECK_MAX: Duration = Duration::from_secs(5);
/// Pause after a failed fork before that slot forks again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// One connection to a new member before it is offered: the server writes its relation
/// cache init files and reads the catalogs into its buffers then, not on the claimer's first
/// connection. Failure only costs that speed-up.
async fn warm_up(b: &Backend) {
    let connected = tokio::time::timeout(
        Duration::from_secs(10),
        crate::pgconn::startup::connect(&b.target, &[], 1 << 20),
    )
    .await;
    match connected {
        Ok(Ok(mut conn)) => {
            use tokio::io::AsyncWriteExt;
            // Terminate, so the server ends the session quietly.
            let _ = conn.reader.get_mut().write_all(b"X\0\0\0\x04").await;
        }
        Ok(Err(e)) => {
            tracing::debug!(handle = %b.handle, error = %e, "warming a pool member failed")
        }
        Err(_) => tracing::debug!(handle = %b.handle, "warming a pool member timed out"),
    }
}

/// Counts a fork in flight for as long as it lives (a panicking fork task included).
struct InFlight(Arc<WarmPool>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.forking.fetch_sub(1, Ordering::SeqCst);
        self.0.refill.notify_one();
    }
}

impl WarmPool {
    /// Destroy members left by an earlier run (their golden may be stale), then keep the
    /// pool full in the background until the process ends. `claimed` maps the handles a
    /// token's record names to that token's tag: a member claimed just before a crash,
    /// still tagged as the pool's, is the token's and gets its tag instead.
    pub async fn start(self: &Arc<Self>, claimed: &HashMap<String, BackendTag>) {
        if let Ok(all) = self.inner.list().await {
            for (handle, tag) in all {
                if tag.is_some_and(|t| t.token_id.starts_with(POOL_PREFIX)) {
                    if let Some(owner) = claimed.get(&handle) {
                        if let Err(e) = self.inner.retag(&handle, owner).await {
                            tracing::warn!(handle, error = %e, "re-tagging a claimed pool member failed");
                        }
                        continue;
                    }
                    if let Err(e) = self.inner.destroy(&handle).await {
                        tracing::warn!(handle, error = %e, "removing a stale pool member failed");
                    }
                }
            }
        }
        tokio::spawn(self.clone().fill());
    }

    async fn fill(self: Arc<Self>) {
        let mut filled_once = false;
        loop {
            if self.is_draining() {
                self.release_waiters();
                return;
            }
            let waiting = self.waiting();
            // The waiters are demand already counted; they need members now, though.
            let target = self.target().max(waiting);
            let ready = self.ready();
            let forking = self.forking.load(Ordering::SeqCst);
            match next_step(ready, forking, target) {
                Step::Wait => {
                    filled_once = true;
                    if target > self.sizing.size || ready > self.sizing.size {
                        // Grown: look again as the demand decays, to shrink back.
                        let recheck = (self.sizing.half_life / 4)
                            .clamp(Duration::from_millis(100), RECHECK_MAX);
                        let _ = tokio::time::timeout(recheck, self.refill.notified()).await;
                    } else {
                        self.refill.notified().await;
                    }
                    continue;
                }
                Step::Shrink => {
                    self.shrink_one().await;
                    continue;
                }
                Step::Fork => {}
            }
            // Members wanted now (a first connection waits, or the pool grows under demand):
            // as many forks at once as there are cores. Otherwise one at a time, so that
            // refilling does not starve live sessions of CPU and disk.
            let wanted_now = waiting > 0 || target > self.sizing.size;
            let limit = if wanted_now { self.parallel } else { 1 };
            if forking >= limit {
                self.refill.notified().await;
                continue;
            }
            if !wanted_now && filled_once && forking == 0 {
                self.hold_after_claims().await;
                if self.waiting() > 0 {
                    continue; // someone waits now: fork at once, in parallel
                }
            }
            self.start_fork();
        }
    }

    /// A claim just happened: let the claimer's first connection and query have the CPU
    /// and disk before the copy of the next member starts, and while claims keep coming,
    /// the claimers after it too: the delay restarts at each claim, up to REFILL_HOLD_MAX.
    /// A first connection that finds nothing ready ends the hold.
    async fn hold_after_claims(&self) {
        let hold_until = tokio::time::Instant::now() + REFILL_HOLD_MAX;
        while tokio::time::timeout_at(
            (tokio::time::Instant::now() + REFILL_DELAY).min(hold_until),
            self.refill.notified(),
        )
        .await
        .is_ok()
            && !self.is_draining()
            && self.waiting() == 0
        {}
    }

    /// Start forking one member in the background (not when draining).
    fn start_fork(self: &Arc<Self>) {
        let handle = format!("{POOL_PREFIX}{}", &crate::auth::new_token_id()[3..]);
        {
            // Checked under the lock drain() sets the flag under: either drain sees this
            // fork in `filling` and waits for it, or no fork starts.
            let mut filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
            if self.is_draining() {
                return;
            }
            filling.push(handle.clone());
            self.forking.fetch_add(1, Ordering::SeqCst);
        }
        let in_flight = InFlight(self.clone());
        tokio::spawn(async move {
            in_flight.0.fork_member(&handle).await;
            drop(in_flight);
        });
    }

    /// Fork member `handle` and offer it (or destroy it when nobody can have it).
    async fn fork_member(&self, handle: &str) {
        let tag = BackendTag {
            token_id: handle.to_string(),
            task: "(warm pool)".into(),
            expires_at: String::new(),
            // Members are this gateway's; an empty id counts as ours to the janitor.
            gateway_id: String::new(),
            golden: None,
        };
        let forked = self.inner.fork(&tag).await;
        // An empty active version is unknown here (a front: its workers know theirs).
        let active = self
            .inner
            .versions()
            .map(|v| v.active_golden())
            .filter(|a| !a.is_empty());
        // The handle stays in `filling` until the member is offered or destroyed, so
        // drain() waits for it (a member warming up was in neither list before).
        let unwanted = match forked {
            Ok(b) if self.is_draining() => Some(b), // shutting down: nobody will claim it
            Ok(b) if active.is_some() && b.golden != active => {
                Some(b) // the golden changed meanwhile
            }
            Ok(b) => {
                // A waiting first connection warms the server up itself, sooner.
                if self.waiting() == 0 {
                    warm_up(&b).await;
                }
                let _filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
                let back = self.offer(b);
                self.publish();
                back
            }
            Err(e) => {
                tracing::warn!(error = %e, "warm pool fork failed; retrying in 5 s");
                // Those waiting fork their own, and see the error if it is lasting.
                self.release_waiters();
                self.end_filling(handle);
                tokio::time::sleep(RETRY_AFTER).await;
                return;
            }
        };
        if let Some(b) = unwanted {
            if let Err(e) = self.inner.destroy(&b.handle).await {
                tracing::warn!(handle = %b.handle, error = %e, "destroying an unwanted pool member failed");
            }
        }
        self.end_filling(handle);
    }
}
