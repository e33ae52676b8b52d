//! A warm pool in front of any provider: keeps forks of the golden ready so that a token's
//! first connection claims one in about the time of a connection instead of waiting for a
//! fork. Members are ordinary backends tagged `pool-…`; a claim re-tags one with its token.
//! A first connection that finds no member ready waits for the next one the filler
//! finishes (whichever it is), not for a fork of its own; the filler is in `fill.rs`.

mod fill;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use super::golden::live::LiveSpec;
use super::golden::store::GoldenInfo;
use super::pool_sizing::{Demand, PoolSizing};
use super::{
    Backend, BackendTag, BoxFuture, GoldenVersions, Provider, ProviderError, SuperuserLogin,
};
use crate::pgconn::BackendTarget;

/// Prefix of the token id in the tag of an unclaimed pool member.
pub const POOL_PREFIX: &str = "pool-";

/// Longest a first connection waits for the filler's next member before forking its own
/// (the filler stuck behind a slow fork, say).
const MEMBER_WAIT_MAX: Duration = Duration::from_secs(60);

/// A provider with a warm pool of ready backends: `size` of them, more (up to `max_size`)
/// while recent new tokens and first connections outnumber them.
pub struct WarmPool {
    inner: Arc<dyn Provider>,
    sizing: PoolSizing,
    /// Recent demand (new tokens, and first connections not announced by one), decaying.
    demand: Mutex<Demand>,
    /// Tokens issued here whose first connection has not come yet (at most `max_size`): their
    /// first connection was counted as demand when they were issued, not again.
    announced: AtomicUsize,
    /// Lock order everywhere: `filling`, then `ready`, then `waiters`.
    ready: Mutex<VecDeque<Backend>>,
    /// First connections waiting for the next member, oldest first.
    waiters: Mutex<VecDeque<oneshot::Sender<Backend>>>,
    /// Handles being forked for the pool right now (so `list` can hide them too).
    filling: Mutex<Vec<String>>,
    /// Forks of the filler in flight.
    forking: AtomicUsize,
    /// Forks the filler may run at once while members are wanted now (the cores).
    parallel: usize,
    refill: Notify,
    /// Set by [`WarmPool::drain`] (under the `filling` lock): no new member is started, and
    /// one that finishes forking is destroyed instead of offered.
    draining: AtomicBool,
}

impl WarmPool {
    /// Wrap `inner`; call [`WarmPool::start`] to begin filling.
    pub fn new(inner: Arc<dyn Provider>, sizing: PoolSizing) -> Arc<WarmPool> {
        Arc::new(WarmPool {
            inner,
            sizing,
            demand: Mutex::new(Demand::new(std::time::Instant::now())),
            announced: AtomicUsize::new(0),
            ready: Mutex::new(VecDeque::new()),
            waiters: Mutex::new(VecDeque::new()),
            filling: Mutex::new(Vec::new()),
            forking: AtomicUsize::new(0),
            parallel: sizing.parallel(std::thread::available_parallelism().map_or(1, |n| n.get())),
            refill: Notify::new(),
            draining: AtomicBool::new(false),
        })
    }

    /// A first connection: demand, unless its token's issue already counted it.
    fn first_connection(&self) {
        let announced = self
            .announced
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !announced {
            self.demand
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(std::time::Instant::now(), self.sizing.half_life);
        }
    }

    /// A ready member; else a place in the queue for the filler's next one (taken under the
    /// `ready` lock, so a member offered meanwhile is never missed); else, while draining,
    /// a fork of the caller's own.
    fn next_member(&self) -> Next {
        let mut ready = self.lock_ready();
        if let Some(b) = ready.pop_front() {
            return Next::Member(Box::new(b));
        }
        if self.is_draining() {
            return Next::Fork;
        }
        let (tx, rx) = oneshot::channel();
        self.lock_waiters().push_back(tx);
        Next::Wait(rx)
    }

    /// A new member to the oldest waiting first connection, else to the ready queue; given
    /// back when the pool is draining. Called under the `filling` lock.
    fn offer(&self, b: Backend) -> Option<Backend> {
        if self.is_draining() {
            return Some(b);
        }
        let mut ready = self.lock_ready();
        let mut waiters = self.lock_waiters();
        let mut b = b;
        while let Some(tx) = waiters.pop_front() {
            match tx.send(b) {
                Ok(()) => return None,
                // That client left: the next one, or the ready queue.
                Err(back) => b = back,
            }
        }
        ready.push_back(b);
        None
    }

    /// First connections waiting for a member; those whose clients left are dropped here, so
    /// abandoned first connections make the filler fork nothing for them.
    fn waiting(&self) -> usize {
        let mut waiters = self.lock_waiters();
        waiters.retain(|tx| !tx.is_closed());
        waiters.len()
    }

    /// Let every waiting first connection fork its own (the filler failed or is stopping).
    fn release_waiters(&self) {
        self.lock_waiters().clear();
    }

    fn lock_waiters(&self) -> std::sync::MutexGuard<'_, VecDeque<oneshot::Sender<Backend>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Members wanted now, from the decayed demand.
    fn target(&self) -> usize {
        let demand = self
            .demand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .value(std::time::Instant::now(), self.sizing.half_life);
        self.sizing.target(demand)
    }

    /// The pool's gauges: members ready, and the size it is heading for.
    fn publish(&self) {
        metrics::gauge!("sandpit_pool_ready").set(self.ready() as f64);
        metrics::gauge!("sandpit_pool_target").set(self.target() as f64);
    }

    /// Destroy the newest idle member (the pool is above its target). It is listed in
    /// `filling` until destroyed, so `list` keeps hiding it and `drain` waits for it.
    async fn shrink_one(&self) {
        let member = {
            let mut filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
            if self.is_draining() {
                return; // drain() destroys the ready members itself
            }
            let b = self.lock_ready().pop_back();
            if let Some(b) = &b {
                filling.push(b.handle.clone());
            }
            b
        };
        let Some(b) = member else { return };
        self.publish();
        if let Err(e) = self.inner.destroy(&b.handle).await {
            tracing::warn!(handle = %b.handle, error = %e, "destroying a surplus pool member failed");
        }
        tracing::debug!(handle = %b.handle, "pool shrunk by one member");
        self.end_filling(&b.handle);
    }

    fn lock_ready(&self) -> std::sync::MutexGuard<'_, VecDeque<Backend>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    fn end_filling(&self, handle: &str) {
        self.filling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|h| h != handle);
    }

    /// Destroy the unclaimed members (gateway shutdown), after waiting (bounded) for a member
    /// being forked right now, which the filler then destroys itself. Returns how many
    /// it destroyed.
    pub async fn drain(&self) -> usize {
        {
            let _filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
            self.draining.store(true, Ordering::SeqCst);
        }
        self.release_waiters();
        self.refill.notify_one();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        while !self
            .filling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let members: Vec<Backend> = self.lock_ready().drain(..).collect();
        let mut destroyed = 0;
        for b in members {
            match self.inner.destroy(&b.handle).await {
                Ok(()) => destroyed += 1,
                Err(e) => {
                    tracing::warn!(handle = %b.handle, error = %e, "destroying a pool member failed")
                }
            }
        }
        destroyed
    }

    /// Unclaimed members ready now.
    pub fn ready(&self) -> usize {
        self.lock_ready().len()
    }

    fn is_member(&self, handle: &str) -> bool {
        self.lock_ready().iter().any(|b| b.handle == handle)
            || self
                .filling
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|h| h == handle)
    }
}

/// What a first connection gets from the pool.
enum Next {
    Member(Box<Backend>),
    Wait(oneshot::Receiver<Backend>),
    Fork,
}

impl Provider for WarmPool {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            self.first_connection();
            let active = self.inner.versions().map(|v| v.active_golden());
            if tag.golden.is_some() && tag.golden != active {
                self.refill.notify_one();
                // Pinned to a version issued before the last switch: members are of the new one.
                return self.inner.fork(tag).await;
            }
            let claimed = loop {
                match self.next_member() {
                    Next::Member(b) if b.golden != active => {
                        // A member of an older golden (the switch raced its claim): never handed out.
                        if let Err(e) = self.inner.destroy(&b.handle).await {
                            tracing::warn!(handle = %b.handle, error = %e, "destroying a stale pool member failed");
                        }
                    }
                    Next::Member(b) => break Some(*b),
                    Next::Wait(rx) => {
                        self.refill.notify_one();
                        self.publish();
                        match tokio::time::timeout(MEMBER_WAIT_MAX, rx).await {
                            Ok(Ok(b)) if b.golden == active => break Some(b),
                            Ok(Ok(b)) => {
                                let _ = self.inner.destroy(&b.handle).await;
                                break None;
                            }
                            // The filler failed, is draining, or is slow: a fork of our own.
                            Ok(Err(_)) | Err(_) => break None,
                        }
                    }
                    Next::Fork => break None,
                }
            };
            self.refill.notify_one();
            self.publish();
            if let Some(mut b) = claimed {
                if self.inner.claims_by_record() {
                    // The caller's registry record makes it the token's (and re-tags it).
                    b.method = format!("pool({})", b.method);
                    return Ok(b);
                }
                match self.inner.retag(&b.handle, tag).await {
                    Ok(()) => {
                        b.method = format!("pool({})", b.method);
                        return Ok(b);
                    }
                    Err(e) => {
                        tracing::warn!(handle = %b.handle, error = %e, "claiming a pool member failed; forking");
                        let _ = self.inner.destroy(&b.handle).await;
                    }
                }
            }
            self.inner.fork(tag).await
        })
    }

    fn expect_first_connection(&self) {
        self.demand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(std::time::Instant::now(), self.sizing.half_life);
        let cap = self.sizing.max_size.max(self.sizing.size);
        let _ = self
            .announced
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < cap).then_some(n + 1)
            });
        self.publish();
        self.refill.notify_one();
    }

    fn claims_by_record(&self) -> bool {
        self.inner.claims_by_record()
    }

    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        self.inner.ensure_running(handle)
    }

    fn check_access<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.inner.check_access(handle)
    }

    fn server_running(&self, handle: &str) -> Option<bool> {
        self.inner.server_running(handle)
    }

    fn end_stale_sessions<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<u64, ProviderError>> {
        self.inner.end_stale_sessions(handle)
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.inner.destroy(handle)
    }

    fn stop<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.inner.stop(handle)
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            // The pool's own members are not any token's: hide them from the janitor.
            let all = self.inner.list().await?;
            Ok(all
                .into_iter()
                .filter(|(h, _)| !self.is_member(h))
                .collect())
        })
    }

    fn secrets(&self) -> Vec<String> {
        self.inner.secrets()
    }

    fn retag<'a>(
        &'a self,
        handle: &'a str,
        tag: &'a BackendTag,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.inner.retag(handle, tag)
    }

    fn reference<'a>(
        &'a self,
        golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        self.inner.reference(golden)
    }

    fn session_target(&self, backend: &Backend, allow: Option<&[String]>) -> BackendTarget {
        self.inner.session_target(backend, allow)
    }

    fn review_target(&self, backend: &Backend) -> BackendTarget {
        self.inner.review_target(backend)
    }

    fn quiesce<'a>(&'a self, backend: &'a Backend) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.inner.quiesce(backend)
    }

    fn ended_backend<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        self.inner.ended_backend(handle)
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        self.inner.release_reference()
    }

    fn verify_forks_by_default(&self) -> bool {
        self.inner.verify_forks_by_default()
    }

    /// The inner provider's, with the pool's own claim of a switch.
    fn versions(&self) -> Option<&dyn GoldenVersions> {
        self.inner.versions().map(|_| self as &dyn GoldenVersions)
    }

    fn superuser_logins(&self) -> Option<&dyn SuperuserLogin> {
        self.inner.superuser_logins()
    }

    fn fleet(&self) -> Option<&dyn super::fleet::Fleet> {
        self.inner.fleet()
    }
}

impl WarmPool {
    /// The inner provider's versions: [`Provider::versions`] hands the pool's out only when
    /// there are some.
    fn inner_versions(&self) -> Result<&dyn GoldenVersions, ProviderError> {
        self.inner.versions().ok_or_else(|| {
            ProviderError::Other(format!(
                "provider {} keeps no golden versions",
                self.inner.name()
            ))
        })
    }
}

impl GoldenVersions for WarmPool {
    fn goldens(&self) -> BoxFuture<'_, Result<Vec<GoldenInfo>, ProviderError>> {
        Box::pin(async move { self.inner_versions()?.goldens().await })
    }

    fn build_golden<'a>(
        &'a self,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(async move { self.inner_versions()?.build_golden(spec).await })
    }

    fn use_golden<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(async move {
            let info = self.inner_versions()?.use_golden(id).await?;
            // Members of the old golden go; the refill copies the new one.
            let stale: Vec<Backend> = {
                let mut ready = self.lock_ready();
                let (keep, stale): (Vec<Backend>, Vec<Backend>) = ready
                    .drain(..)
                    .partition(|b| b.golden.as_deref() == Some(info.id.as_str()));
                *ready = keep.into();
                stale
            };
            for b in stale {
                if let Err(e) = self.inner.destroy(&b.handle).await {
                    tracing::warn!(handle = %b.handle, error = %e, "destroying a stale pool member failed");
                }
            }
            self.publish();
            self.refill.notify_one();
            Ok(info)
        })
    }

    fn active_golden(&self) -> String {
        self.inner
            .versions()
            .map(|v| v.active_golden())
            .unwrap_or_default()
    }

    fn pin_golden<'a>(
        &'a self,
        token: &'a str,
        expires_at: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async move { self.inner_versions()?.pin_golden(token, expires_at).await })
    }

    fn unpin_golden<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.inner_versions()?.unpin_golden(token).await })
    }
}
