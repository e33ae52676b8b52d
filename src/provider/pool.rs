//! A warm pool in front of any provider: keeps forks of the golden ready so that a token's
//! first connection claims one in about the time of a connection instead of waiting for a
//! fork. Members are ordinary backends tagged `pool-…`; a claim re-tags one with its token.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::golden::live::LiveSpec;
use super::golden::store::GoldenInfo;
use super::pool_sizing::{next_step, Demand, PoolSizing, Step};
use super::{
    Backend, BackendTag, BoxFuture, GoldenVersions, Provider, ProviderError, SuperuserLogin,
};
use crate::pgconn::BackendTarget;

/// Prefix of the token id in the tag of an unclaimed pool member.
pub const POOL_PREFIX: &str = "pool-";

/// Pause between a claim and the refill it triggers (restarted by each further claim).
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(500);
/// Longest a stream of claims holds the refill back.
const REFILL_HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// One connection to a new member before it is offered: the server writes its relation
/// cache init files and reads the catalogs into its buffers then, not on the claimer's first
/// connection. Failure only costs that speed-up.
async fn warm_up(b: &Backend) {
    let connected = tokio::time::timeout(
        std::time::Duration::from_secs(10),
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

/// Longest wait before the filler looks at a grown pool again (its demand decays meanwhile).
const RECHECK_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// A provider with a warm pool of ready backends: `size` of them, more (up to `max_size`)
/// while recent first connections outnumber them.
pub struct WarmPool {
    inner: Arc<dyn Provider>,
    sizing: PoolSizing,
    /// Recent first connections (claims and misses alike), decaying.
    demand: Mutex<Demand>,
    ready: Mutex<VecDeque<Backend>>,
    /// Handles being forked for the pool right now (so `list` can hide them too).
    filling: Mutex<Vec<String>>,
    refill: Notify,
    /// Set by [`WarmPool::drain`] (under the `filling` lock): no new member is started, and
    /// one that finishes forking is destroyed instead of offered.
    draining: std::sync::atomic::AtomicBool,
}

impl WarmPool {
    /// Wrap `inner`; call [`WarmPool::start`] to begin filling.
    pub fn new(inner: Arc<dyn Provider>, sizing: PoolSizing) -> Arc<WarmPool> {
        Arc::new(WarmPool {
            inner,
            sizing,
            demand: Mutex::new(Demand::new(std::time::Instant::now())),
            ready: Mutex::new(VecDeque::new()),
            filling: Mutex::new(Vec::new()),
            refill: Notify::new(),
            draining: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Destroy members left by an earlier run (their golden may be stale), then keep the
    /// pool full in the background until the process ends. `claimed` maps the handles a
    /// token's record names to that token's tag: a member claimed just before a crash,
    /// still tagged as the pool's, is the token's and gets its tag instead.
    pub async fn start(self: &Arc<Self>, claimed: &std::collections::HashMap<String, BackendTag>) {
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
        let pool = self.clone();
        tokio::spawn(async move {
            let mut filled_once = false;
            loop {
                if pool.is_draining() {
                    return;
                }
                let target = pool.target();
                let ready = pool.lock_ready().len();
                match next_step(ready, 0, target) {
                    Step::Wait => {
                        filled_once = true;
                        if target > pool.sizing.size || ready > pool.sizing.size {
                            // Grown: look again as the demand decays, to shrink back.
                            let recheck = (pool.sizing.half_life / 4)
                                .clamp(std::time::Duration::from_millis(100), RECHECK_MAX);
                            let _ = tokio::time::timeout(recheck, pool.refill.notified()).await;
                        } else {
                            pool.refill.notified().await;
                        }
                        continue;
                    }
                    Step::Shrink => {
                        pool.shrink_one().await;
                        continue;
                    }
                    Step::Fork => {}
                }
                if filled_once && target <= pool.sizing.size {
                    // A claim just happened: let the claimer's first connection and query
                    // have the CPU and disk before the copy of the next member starts, and
                    // while claims keep coming (a burst emptying the pool), the claimers
                    // after it too: the delay restarts at each claim, up to REFILL_HOLD_MAX.
                    // (Not while growing under a burst: then members are wanted soon.)
                    let hold_until = tokio::time::Instant::now() + REFILL_HOLD_MAX;
                    while tokio::time::timeout_at(
                        (tokio::time::Instant::now() + REFILL_DELAY).min(hold_until),
                        pool.refill.notified(),
                    )
                    .await
                    .is_ok()
                        && !pool.is_draining()
                    {}
                }
                // One at a time: refilling must not starve live sessions of CPU and disk.
                let handle = format!("{POOL_PREFIX}{}", &crate::auth::new_token_id()[3..]);
                {
                    // Checked under the lock drain() sets the flag under: either drain sees
                    // this fork in `filling` and waits for it, or no fork starts.
                    let mut filling = pool.filling.lock().unwrap_or_else(|p| p.into_inner());
                    if pool.is_draining() {
                        return;
                    }
                    filling.push(handle.clone());
                }
                let tag = BackendTag {
                    token_id: handle.clone(),
                    task: "(warm pool)".into(),
                    expires_at: String::new(),
                    // Members are this gateway's; an empty id counts as ours to the janitor.
                    gateway_id: String::new(),
                    golden: None,
                };
                let forked = pool.inner.fork(&tag).await;
                // The handle stays in `filling` until the member is offered or destroyed, so
                // drain() waits for it (a member warming up was in neither list before).
                let unwanted = match forked {
                    Ok(b) if pool.is_draining() => Some(b), // shutting down: nobody will claim it
                    Ok(b) if b.golden != pool.inner.versions().map(|v| v.active_golden()) => {
                        Some(b)
                    } // the golden changed meanwhile
                    Ok(b) => {
                        warm_up(&b).await;
                        let _filling = pool.filling.lock().unwrap_or_else(|p| p.into_inner());
                        if pool.is_draining() {
                            Some(b)
                        } else {
                            pool.lock_ready().push_back(b);
                            pool.publish();
                            None
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "warm pool fork failed; retrying in 5 s");
                        pool.end_filling(&handle);
                        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                        continue;
                    }
                };
                if let Some(b) = unwanted {
                    if let Err(e) = pool.inner.destroy(&b.handle).await {
                        tracing::warn!(handle = %b.handle, error = %e, "destroying an unwanted pool member failed");
                    }
                }
                pool.end_filling(&handle);
            }
        });
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
        self.draining.load(std::sync::atomic::Ordering::SeqCst)
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
            self.draining
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
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

impl Provider for WarmPool {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            // Every first connection is demand, whether a member is ready for it or not.
            self.demand
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(std::time::Instant::now(), self.sizing.half_life);
            let active = self.inner.versions().map(|v| v.active_golden());
            if tag.golden.is_some() && tag.golden != active {
                self.refill.notify_one();
                // Pinned to a version issued before the last switch: members are of the new one.
                return self.inner.fork(tag).await;
            }
            let claimed = loop {
                let next = self.lock_ready().pop_front();
                match next {
                    // A member of an older golden (the switch raced its claim): never handed out.
                    Some(b) if b.golden != active => {
                        if let Err(e) = self.inner.destroy(&b.handle).await {
                            tracing::warn!(handle = %b.handle, error = %e, "destroying a stale pool member failed");
                        }
                    }
                    other => break other,
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
    ) -> BoxFuture<'a, Result<String, ProviderError>> {
        Box::pin(async move { self.inner_versions()?.pin_golden(token, expires_at).await })
    }

    fn unpin_golden<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.inner_versions()?.unpin_golden(token).await })
    }
}
