//! The janitor: finds what the registry and the provider disagree on and settles it. Every
//! tagged backend whose token is expired, revoked or unknown is destroyed; a token whose
//! backend vanished is marked so its next connection forks anew; a live token's server that
//! died under a running gateway (kill -9, OOM killer) is restarted (Postgres recovers it from
//! its WAL). It runs at start, on a schedule, and by hand (`sandpit reap`).
//!
//! Safety rules: an untagged backend is never touched (it is not provably ours); a backend
//! tagged by another gateway is left alone unless its token is in our registry; and every
//! change for a known token is made holding that token's backend mutex, the one a fork holds
//! from start to registry record, so a fork in progress is never raced.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::watch;

pub use super::reap_report::{ReapReason, ReapReport, Reaped, Skipped};
use super::{EndReason, Gateway, LifecycleError};
use crate::provider::pool::POOL_PREFIX;
use crate::provider::ProviderError;
use crate::registry::{end, TokenRecord, TokenState};

/// Name of the file in the data dir that holds the gateway id.
pub const GATEWAY_ID_FILE: &str = "gateway.id";

/// Reads the gateway id from `<data_dir>/gateway.id`, creating it on first start.
pub fn gateway_id(data_dir: &Path) -> std::io::Result<String> {
    let path = data_dir.join(GATEWAY_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let id = hex::encode(rand::random::<[u8; 8]>());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    // Private like the rest of the data dir (an older version wrote it 0644).
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    f.write_all(id.as_bytes())?;
    f.sync_all()?;
    Ok(id)
}

enum Verdict {
    Keep,
    /// An ended token's backend kept for its review (not stored yet).
    Hold,
    Reap(ReapReason),
}

fn verdict(rec: Option<&TokenRecord>, handle: &str, now: OffsetDateTime) -> Verdict {
    let Some(r) = rec else {
        return Verdict::Reap(ReapReason::Unknown);
    };
    if !r.state.is_usable() && !end::may_destroy(r) {
        return Verdict::Hold;
    }
    match r.state {
        TokenState::Expired => Verdict::Reap(ReapReason::Expired),
        TokenState::Revoked => Verdict::Reap(ReapReason::Revoked),
        _ if r.expires_at <= now => Verdict::Reap(ReapReason::Expired),
        _ if r.backend.as_deref() == Some(handle) => Verdict::Keep,
        _ => Verdict::Reap(ReapReason::Orphan),
    }
}

/// Sets `sandpit_tokens{state}` and `sandpit_backends` from the registry, which survives
/// restarts: backends are the ones recorded for a token (each janitor pass makes that what
/// exists, so a count of leftovers is never hidden for longer than one interval).
pub fn refresh_gauges(gw: &Gateway) {
    let mut counts = [0u64; 4];
    let mut backends = 0u64;
    for r in gw.registry.list() {
        backends += u64::from(r.backend.is_some());
        if let Some(i) = TokenState::ALL.iter().position(|s| *s == r.state) {
            counts[i] += 1;
        }
    }
    for (state, n) in TokenState::ALL.iter().zip(counts) {
        metrics::gauge!("sandpit_tokens", "state" => state.as_str()).set(n as f64);
    }
    metrics::gauge!("sandpit_backends").set(backends as f64);
    // Forks, logs and reviews all live on the data dir's filesystem: alert before it fills.
    if let Some(free) = crate::datadir::free_bytes(&gw.config.data_dir) {
        metrics::gauge!("sandpit_data_dir_free_bytes").set(free as f64);
    }
}

/// Runs one pass. A dry run only reports. Errors listing backends end the pass; errors on
/// one backend are recorded and the pass goes on.
pub async fn run_pass(gw: &Arc<Gateway>, dry_run: bool) -> Result<ReapReport, LifecycleError> {
    let _one_at_a_time = gw.janitor_lock.lock().await;
    // And one at a time across replicas sharing a registry.
    let _across = gw.registry.lock("janitor").await?;
    let records: HashMap<String, TokenRecord> = gw
        .registry
        .list_fresh()
        .await?
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();
    let mut ends = ReapReport::default();
    if !dry_run {
        super::ending::finish_ends(gw, records.values(), &mut ends).await;
    }
    let records: HashMap<String, TokenRecord> = if ends.reviewed.is_empty() {
        records
    } else {
        // Their backends are gone now.
        gw.registry
            .list_fresh()
            .await?
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect()
    };
    let listed = gw.provider.list().await?;
    let now = OffsetDateTime::now_utc();
    let mut report = ReapReport {
        dry_run,
        backends: listed.len(),
        ..ends
    };
    let present: HashSet<String> = listed.iter().map(|(h, _)| h.clone()).collect();

    for (handle, tag) in &listed {
        let Some(tag) = tag else {
            report.skipped.push(Skipped {
                handle: handle.clone(),
                why: "untagged",
            });
            continue;
        };
        if crate::provider::holds::in_flight(handle)
            || crate::provider::holds::in_flight(&tag.token_id)
        {
            // In use by a review: an end-of-token review, or a patch check (by handle, or
            // by tag while a warm-pool member is claimed for it). Its holder destroys it;
            // a crash leaves it to the next pass.
            report.skipped.push(Skipped {
                handle: handle.clone(),
                why: "review",
            });
            continue;
        }
        if tag.token_id.starts_with(POOL_PREFIX) {
            // An unclaimed warm-pool member (the pool hides its own, but one being claimed or
            // just forked may show for a moment); the pool removes stale ones at start.
            report.skipped.push(Skipped {
                handle: handle.clone(),
                why: "pool",
            });
            continue;
        }
        let rec = records.get(&tag.token_id).cloned();
        let foreign = !tag.gateway_id.is_empty() && tag.gateway_id != gw.gateway_id;
        if rec.is_none() && foreign {
            report.skipped.push(Skipped {
                handle: handle.clone(),
                why: "foreign",
            });
            continue;
        }
        // A first look without locks; `reap_one` decides again under the token's lock.
        let first = verdict(rec.as_ref(), handle, now);
        if let Verdict::Hold = first {
            report.kept += 1;
            continue;
        }
        if let Verdict::Keep = first {
            if let Err(ProviderError::Tampered(why)) = gw.provider.check_access(handle).await {
                if !dry_run {
                    gw.end_tampered(&tag.token_id, &why).await;
                }
                report.tampered.push(tag.token_id.clone());
                continue;
            }
            match restart_dead(gw, &tag.token_id, handle, dry_run).await {
                Ok(false) => {}
                Ok(true) => report.dead.push(tag.token_id.clone()),
                Err(e) => {
                    report.dead.push(tag.token_id.clone());
                    report
                        .errors
                        .push(format!("backend {handle}: restarting its dead server: {e}"));
                }
            }
            report.kept += 1;
            continue;
        }
        let reaped = |reason| Reaped {
            handle: handle.clone(),
            token: tag.token_id.clone(),
            task: tag.task.clone(),
            reason,
        };
        match reap_one(gw, handle, &tag.token_id, rec.is_some(), dry_run).await {
            Ok(Some(reason)) if dry_run => report.reaped.push(reaped(reason)),
            Ok(Some(reason)) => {
                tracing::info!(token = %tag.token_id, task = %tag.task, handle = %handle,
                    reason = reason.as_str(), "janitor destroyed backend");
                metrics::counter!("sandpit_janitor_reaped_total", "reason" => reason.as_str())
                    .increment(1);
                report.reaped.push(reaped(reason));
            }
            Ok(None) => report.kept += 1,
            Err(e) => report.errors.push(format!("backend {handle}: {e}")),
        }
    }

    for rec in records.values() {
        let Some(h) = rec.backend.as_deref() else {
            continue;
        };
        if present.contains(h) {
            continue;
        }
        if dry_run {
            report.vanished.push(rec.id.clone());
            continue;
        }
        match mark_vanished(gw, &rec.id, h).await {
            Ok(true) => {
                tracing::warn!(token = %rec.id, task = %rec.task, handle = %h,
                    "janitor: backend vanished; the next connection forks a new one");
                metrics::counter!("sandpit_janitor_vanished_total").increment(1);
                report.vanished.push(rec.id.clone());
            }
            Ok(false) => {}
            Err(e) => report.errors.push(format!("token {}: {e}", rec.id)),
        }
    }

    if !dry_run {
        if let Some(shared) = gw.registry.shared() {
            // Cancel keys of sessions whose token has ended.
            if let Err(e) = shared.cancel_purge(None).await {
                report.errors.push(format!("cancel keys: {e}"));
            }
        }
        metrics::counter!("sandpit_janitor_runs_total").increment(1);
        if !report.errors.is_empty() {
            metrics::counter!("sandpit_janitor_errors_total").increment(report.errors.len() as u64);
        }
        refresh_gauges(gw);
    }
    if report.reaped.is_empty()
        && report.reviewed.is_empty()
        && report.review_failed.is_empty()
        && report.vanished.is_empty()
        && report.dead.is_empty()
        && report.errors.is_empty()
    {
        tracing::debug!(
            backends = report.backends,
            kept = report.kept,
            dry_run,
            "janitor pass"
        );
    } else {
        tracing::info!(
            backends = report.backends,
            kept = report.kept,
            reaped = report.reaped.len(),
            reviewed = report.reviewed.len(),
            review_failed = report.review_failed.len(),
            vanished = report.vanished.len(),
            dead = report.dead.len(),
            skipped = report.skipped.len(),
            errors = report.errors.len(),
            dry_run,
            "janitor pass"
        );
        for e in &report.errors {
            tracing::warn!(error = %e, "janitor");
        }
    }
    Ok(report)
}

/// Destroys one backend if, checked again under the token's backend mutex (so after any fork
/// in progress has recorded its handle), it still is not a valid token's recorded backend.
/// Returns the reason, or None when it turned out to be kept. A dry run changes nothing.
async fn reap_one(
    gw: &Arc<Gateway>,
    handle: &str,
    token: &str,
    known: bool,
    dry_run: bool,
) -> Result<Option<ReapReason>, LifecycleError> {
    if !known {
        // No fork can run for a token the registry does not know.
        if dry_run {
            return Ok(Some(ReapReason::Unknown));
        }
        gw.provider.destroy(handle).await?;
        count_destroy();
        return Ok(Some(ReapReason::Unknown));
    }
    let expired_unmarked = gw
        .registry
        .fresh(token)
        .await?
        .is_some_and(|r| r.state.is_usable() && r.expires_at <= OffsetDateTime::now_utc());
    if expired_unmarked && !dry_run {
        // Ending it like its timer would also ends its sessions with the reason.
        gw.end(token, EndReason::Expired).await?;
    }
    let rt = gw.runtime(token);
    let mut slot = rt.backend.lock().await;
    let _across = gw.registry.lock_token(token).await?;
    let rec = gw.registry.fresh(token).await?;
    let reason = match verdict(rec.as_ref(), handle, OffsetDateTime::now_utc()) {
        Verdict::Keep | Verdict::Hold => return Ok(None),
        Verdict::Reap(r) => r,
    };
    if dry_run {
        return Ok(Some(reason));
    }
    if crate::provider::holds::in_flight(handle) {
        // Its end-of-token review began since the first look; the end destroys it after.
        return Ok(None);
    }
    // Another replica may have destroyed it (ending its token) since this pass listed it:
    // destroy only what still exists, so each backend is destroyed once.
    if gw.registry.is_shared() && !gw.provider.list().await?.iter().any(|(h, _)| h == handle) {
        return Ok(None);
    }
    gw.provider.destroy(handle).await?;
    count_destroy();
    if rec.and_then(|r| r.backend).as_deref() == Some(handle) {
        slot.take();
        gw.registry.update(token, |r| r.backend = None).await?;
    }
    Ok(Some(reason))
}

fn count_destroy() {
    metrics::counter!("sandpit_destroys_total").increment(1);
}

/// Restarts the server of a live token's backend that this gateway has running (cached in the
/// token's runtime: not suspended while idle, not stopped at shutdown) when its process is
/// gone. Under the token's backend mutex, skipped while something else holds it (a fork, a
/// restart or a suspend settles the backend itself). Returns whether it was found dead.
async fn restart_dead(
    gw: &Arc<Gateway>,
    token: &str,
    handle: &str,
    dry_run: bool,
) -> Result<bool, LifecycleError> {
    let Some(rt) = gw.runtimes.get(token).map(|r| r.clone()) else {
        return Ok(false);
    };
    let Ok(mut slot) = rt.backend.try_lock() else {
        return Ok(false);
    };
    if slot.as_ref().map(|b| b.handle.as_str()) != Some(handle)
        || gw.provider.server_running(handle) != Some(false)
    {
        return Ok(false);
    }
    if dry_run {
        return Ok(true);
    }
    metrics::counter!("sandpit_janitor_dead_backends_total").increment(1);
    tracing::warn!(token = %token, handle = %handle, "janitor: scratch server found dead; restarting it");
    match gw.provider.ensure_running(handle).await {
        Ok(b) => {
            tracing::info!(token = %token, method = %b.method, "janitor: scratch server restarted");
            *slot = Some(b);
            Ok(true)
        }
        Err(e) => {
            // Forgotten, so the next connection checks it again (as after a failed connect).
            slot.take();
            metrics::gauge!("sandpit_backends").decrement(1.0);
            Err(e.into())
        }
    }
}

/// Forgets a token's recorded backend that no longer exists. Checked again under the token's
/// backend mutex; returns whether it was marked.
async fn mark_vanished(
    gw: &Arc<Gateway>,
    token: &str,
    handle: &str,
) -> Result<bool, LifecycleError> {
    let rt = gw.runtime(token);
    let mut slot = rt.backend.lock().await;
    let _across = gw.registry.lock_token(token).await?;
    let still = gw
        .registry
        .fresh(token)
        .await?
        .is_some_and(|r| r.backend.as_deref() == Some(handle));
    if !still {
        return Ok(false);
    }
    let exists = gw.provider.list().await?.iter().any(|(h, _)| h == handle);
    if exists {
        return Ok(false);
    }
    slot.take();
    gw.registry.update(token, |r| r.backend = None).await?;
    Ok(true)
}

/// Runs a pass every `interval` until `stop` turns true (the pass at start is the caller's).
pub fn spawn(
    gw: Arc<Gateway>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if interval.is_zero() {
            return;
        }
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = run_pass(&gw, false).await {
                        metrics::counter!("sandpit_janitor_errors_total").increment(1);
                        tracing::warn!(error = %e, "janitor pass failed");
                    }
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() { break; }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: TokenState, backend: Option<&str>, expires_in: i64) -> TokenRecord {
        let mut r = TokenRecord::for_tests("t1");
        r.expires_at = OffsetDateTime::now_utc() + time::Duration::seconds(expires_in);
        r.state = state;
        r.backend = backend.map(str::to_string);
        r
    }

    fn reason(v: Verdict) -> Option<ReapReason> {
        match v {
            Verdict::Keep | Verdict::Hold => None,
            Verdict::Reap(r) => Some(r),
        }
    }

    #[test]
    fn verdicts() {
        let now = OffsetDateTime::now_utc();
        let live = rec(TokenState::Live, Some("t1"), 60);
        assert_eq!(reason(verdict(Some(&live), "t1", now)), None);
        // Valid token, but this backend is not the recorded one: an interrupted fork.
        let issued = rec(TokenState::Issued, None, 60);
        assert_eq!(
            reason(verdict(Some(&issued), "t1", now)),
            Some(ReapReason::Orphan)
        );
        let past = rec(TokenState::Live, Some("t1"), -1);
        assert_eq!(
            reason(verdict(Some(&past), "t1", now)),
            Some(ReapReason::Expired)
        );
        let revoked = rec(TokenState::Revoked, Some("t1"), 60);
        assert_eq!(
            reason(verdict(Some(&revoked), "t1", now)),
            Some(ReapReason::Revoked)
        );
        assert_eq!(reason(verdict(None, "t1", now)), Some(ReapReason::Unknown));
        // Ended, its review not stored: kept for the review, whatever the TTL says.
        let mut ending = rec(TokenState::Revoked, Some("t1"), -1);
        ending.end = Some(end::EndPhase::Ending);
        assert!(matches!(verdict(Some(&ending), "t1", now), Verdict::Hold));
        ending.end = Some(end::EndPhase::Reviewed);
        assert_eq!(
            reason(verdict(Some(&ending), "t1", now)),
            Some(ReapReason::Revoked)
        );
        ending.end = Some(end::EndPhase::Discarded);
        assert_eq!(
            reason(verdict(Some(&ending), "t1", now)),
            Some(ReapReason::Revoked)
        );
    }

    #[test]
    fn gateway_id_is_created_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("sandpit-gwid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = gateway_id(&dir).unwrap();
        assert_eq!(a.len(), 16);
        assert_eq!(gateway_id(&dir).unwrap(), a);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
