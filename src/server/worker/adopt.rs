//! A worker's start on a data dir an earlier run left (a crash, SIGKILL, a node restart with
//! its volume): the forks whose sandbox record is kept and whose TTL has not passed are
//! adopted again, each with a new door and a new door password, so fronts' tokens keep
//! working; every other leftover fork is destroyed before anything new is made.

use std::collections::HashSet;
use std::sync::Arc;

use time::OffsetDateTime;

use super::keep::{Keeper, Kept};
use super::{api, lock, Entry, Worker};
use crate::provider::remote_api::{self as remote_api, SandboxState};
use crate::provider::Provider;

/// When a kept sandbox's TTL deletes it; None when no TTL was set (not adopted: a front
/// sets one before it ever sees the sandbox ready).
fn expiry(k: &Kept) -> Option<OffsetDateTime> {
    k.sb.expires_at.as_deref().and_then(crate::rfc3339::parse)
}

/// What to adopt, and the door ports of the earlier run (no new door takes one). Forks with
/// no live record are destroyed; records of forks that are gone are removed.
pub(super) async fn sort_leftovers(
    provider: &dyn Provider,
    keeper: &Keeper,
) -> (Vec<Kept>, HashSet<u16>) {
    let kept = keeper.load_all();
    let old_ports = kept.iter().filter_map(|k| k.port).collect();
    let now = OffsetDateTime::now_utc();
    let left = match provider.list().await {
        Ok(l) => Some(l),
        Err(e) => {
            // Nothing is destroyed on a failed list; adoption finds what exists.
            tracing::warn!(error = %e, "worker: listing leftover forks failed");
            None
        }
    };
    let exists = |h: &str| left.as_ref().is_none_or(|l| l.iter().any(|(x, _)| x == h));
    let (adopt, drop): (Vec<Kept>, Vec<Kept>) = kept
        .into_iter()
        .partition(|k| expiry(k).is_some_and(|t| t > now) && exists(&k.handle));
    for k in &drop {
        forget(keeper, &k.sb.id);
    }
    let keep: HashSet<&str> = adopt.iter().map(|k| k.handle.as_str()).collect();
    let mut removed = 0;
    for (h, _) in left
        .iter()
        .flatten()
        .filter(|(h, _)| !keep.contains(h.as_str()))
    {
        match provider.destroy(h).await {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(handle = %h, error = %e, "worker: removing a leftover fork failed")
            }
        }
    }
    if removed > 0 || !drop.is_empty() {
        tracing::info!(
            forks = removed,
            records = drop.len(),
            "worker: leftovers of an earlier run removed (no record, or past their TTL)"
        );
    }
    (adopt, old_ports)
}

fn forget(keeper: &Keeper, id: &str) {
    if let Err(e) = keeper.forget(id) {
        tracing::warn!(sandbox = %id, error = %e, "worker: removing a sandbox record failed");
    }
}

/// Adopts each kept sandbox: its server running (restarted if it died), a new door, served
/// as before. One that cannot be adopted is destroyed (its tokens fail as on a lost worker).
pub(super) async fn adopt_all(w: &Arc<Worker>, kept: Vec<Kept>) {
    let mut adopted = 0;
    for k in kept {
        match adopt_one(w, &k).await {
            Ok(()) => adopted += 1,
            Err(e) => {
                tracing::warn!(sandbox = %k.sb.id, error = %e, "worker: adopting a sandbox failed; destroying it");
                if let Err(e) = w.provider.destroy(&k.handle).await {
                    tracing::warn!(handle = %k.handle, error = %e, "worker: destroying an unadoptable fork failed");
                }
                forget(&w.keeper, &k.sb.id);
            }
        }
    }
    if adopted > 0 {
        tracing::info!(
            sandboxes = adopted,
            "worker: {adopted} sandbox(es) of an earlier run adopted"
        );
    }
}

async fn adopt_one(w: &Arc<Worker>, k: &Kept) -> Result<(), String> {
    let b = w
        .provider
        .ensure_running(&k.handle)
        .await
        .map_err(|e| e.to_string())?;
    let (door, conn) = api::open_door(w, &b).await?;
    let mut sb = k.sb.clone();
    sb.state = SandboxState::Ready;
    sb.connection = Some(conn);
    sb.error = None;
    // The new door's port is the one kept from now on.
    if let Err(e) = w.keeper.save(&sb, &k.handle) {
        tracing::warn!(sandbox = %sb.id, error = %e, "worker: rewriting a sandbox record failed");
    }
    let id = sb.id.clone();
    if let Some(t) = sb.metadata.get(remote_api::META_TOKEN) {
        // A front's retried create (its idempotency key is the token id) finds it again.
        lock(&w.by_key).insert(t.clone(), id.clone());
    }
    let mut e = Entry::new(sb);
    e.handle = Some(k.handle.clone());
    e.door = Some(door);
    e.expires = expiry(k);
    lock(&w.sandboxes).insert(id.clone(), e);
    tracing::info!(sandbox = %id, "worker: sandbox adopted with a new door");
    Ok(())
}
