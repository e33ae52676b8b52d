//! Several sandbox services behind one provider (`remote.urls`, e.g. sandpit workers): a new
//! fork goes to the service with the most room, by each one's `GET /v1/capacity` (cached for
//! a moment; see `place` for the choice), skipping one that fails; a token keeps its service,
//! since its handle names it: `w<position in remote.urls>.<sandbox id>`. A service whose fork
//! or capacity question failed is tried last for a short while, so a dead worker does not slow
//! every other new token down by its connect timeout and retries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::place::{self, Room};
use super::RemoteProvider;
use crate::provider::{Backend, BackendTag, BoxFuture, Provider, ProviderError};

/// The services, in `remote.urls` order, and what is known of their room.
pub struct RemoteSet {
    members: Vec<(String, RemoteProvider)>,
    /// Where ties start (round-robin among equal rooms).
    next: AtomicUsize,
    /// Per member: until when it is tried last, after a failed fork.
    failed_until: Mutex<Vec<Option<Instant>>>,
    /// Per member: its room as last reported (plus forks placed since), and when asked.
    rooms: Mutex<Vec<(Room, Option<Instant>)>>,
    /// One capacity refresh at a time; forks arriving meanwhile wait for its answers.
    refreshing: tokio::sync::Mutex<()>,
}

/// How long a member whose fork failed is tried after the others.
const FAILED_FOR: Duration = Duration::from_secs(10);
/// How long a capacity report is used before the member is asked again.
const ROOM_FRESH_FOR: Duration = Duration::from_secs(2);
/// Longest wait for one capacity answer (asked of all stale members at once).
const CAPACITY_WITHIN: Duration = Duration::from_secs(1);

/// Whether a member's room, asked at `asked`, is due to be asked again at `now`. A member
/// that could not be asked is asked again only after `FAILED_FOR`, so a dead worker does not
/// hold up a fork every `ROOM_FRESH_FOR`.
fn stale(room: &Room, asked: Option<Instant>, now: Instant) -> bool {
    let fresh_for = match room {
        Room::Unreachable => FAILED_FOR,
        Room::Known(_) | Room::Unreported => ROOM_FRESH_FOR,
    };
    asked.is_none_or(|t| now.saturating_duration_since(t) >= fresh_for)
}

/// `w3.sbx-17` → (3, "sbx-17").
fn split(handle: &str) -> Option<(usize, &str)> {
    let (n, id) = handle.strip_prefix('w')?.split_once('.')?;
    Some((n.parse().ok()?, id))
}

impl RemoteSet {
    /// One member per (URL, provider); at least one.
    pub fn new(members: Vec<(String, RemoteProvider)>) -> Result<Self, ProviderError> {
        if members.is_empty() {
            return Err(ProviderError::Invalid("remote.urls is empty".into()));
        }
        let n = members.len();
        Ok(RemoteSet {
            members,
            next: AtomicUsize::new(0),
            failed_until: Mutex::new(vec![None; n]),
            rooms: Mutex::new(vec![(Room::Unreported, None); n]),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// Asks the members whose report is stale (all of them with `force`) for their capacity,
    /// all at once, each within `CAPACITY_WITHIN`.
    async fn refresh_rooms(&self, force: bool) {
        let due = |now| -> Vec<usize> {
            let rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
            (0..rooms.len())
                .filter(|&i| force || stale(&rooms[i].0, rooms[i].1, now))
                .collect()
        };
        if due(Instant::now()).is_empty() {
            return;
        }
        let _one = self.refreshing.lock().await;
        // Another fork may have refreshed while this one waited.
        let asked_at = Instant::now();
        let due = due(asked_at);
        if due.is_empty() {
            return;
        }
        let answers = futures_util::future::join_all(
            due.iter()
                .map(|&i| self.members[i].1.capacity(CAPACITY_WITHIN)),
        )
        .await;
        let mut rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        for (&i, answer) in due.iter().zip(answers) {
            let room = match answer {
                Ok(Some(c)) => Room::Known(c),
                Ok(None) => Room::Unreported,
                Err(e) => {
                    if rooms[i].0 != Room::Unreachable {
                        tracing::warn!(worker = i, error = %self.named(i, e), "capacity unknown; this worker is tried last");
                    }
                    Room::Unreachable
                }
            };
            rooms[i] = (room, Some(asked_at));
        }
    }

    /// The members to try, best first (see `place::order`): a member whose fork failed
    /// lately counts as unreachable unless its report already leaves it out.
    fn pick(&self, start: usize) -> Vec<usize> {
        let now = Instant::now();
        let rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        let failed = self.failed_until.lock().unwrap_or_else(|p| p.into_inner());
        let seen: Vec<Room> = rooms
            .iter()
            .zip(failed.iter())
            .map(|((room, _), f)| match room {
                r if r.refuses() => *r,
                _ if f.is_some_and(|t| t > now) => Room::Unreachable,
                r => *r,
            })
            .collect();
        place::order(&seen, start)
    }

    /// The error when no member takes a new fork: which is full, which draining.
    fn no_room(&self) -> ProviderError {
        let rooms = self.rooms.lock().unwrap_or_else(|p| p.into_inner());
        let why: Vec<String> = rooms
            .iter()
            .enumerate()
            .filter_map(|(i, (r, _))| {
                r.why_not()
                    .map(|w| format!("worker {i} ({}) {w}", self.members[i].0))
            })
            .collect();
        ProviderError::Remote(format!("no worker takes a new sandbox: {}", why.join(", ")))
    }

    /// The member a handle names, with the service's own sandbox id.
    fn member<'h>(
        &self,
        handle: &'h str,
    ) -> Result<(usize, &RemoteProvider, &'h str), ProviderError> {
        let (n, id) = split(handle)
            .ok_or_else(|| ProviderError::NotFound(format!("invalid handle {handle:?}")))?;
        let (_, p) = self.members.get(n).ok_or_else(|| {
            ProviderError::NotFound(format!("handle {handle:?} names no service in remote.urls"))
        })?;
        Ok((n, p, id))
    }

    /// A member's error, naming the member (a gateway log line says which worker failed).
    fn named(&self, n: usize, e: ProviderError) -> ProviderError {
        let worker = format!("worker {n} ({})", self.members[n].0);
        match e {
            ProviderError::Remote(m) => ProviderError::Remote(format!("{worker}: {m}")),
            ProviderError::RemoteHttp { what, source } => ProviderError::RemoteHttp {
                what: format!("{worker}: {what}"),
                source,
            },
            ProviderError::RemoteJson { what, source } => ProviderError::RemoteJson {
                what: format!("{worker}: {what}"),
                source,
            },
            other => other,
        }
    }

    fn prefixed(n: usize, mut b: Backend) -> Backend {
        b.handle = format!("w{n}.{}", b.handle);
        b
    }
}

impl Provider for RemoteSet {
    fn verify_forks_by_default(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "remote"
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let start = self.next.fetch_add(1, Ordering::Relaxed);
            self.refresh_rooms(false).await;
            let mut tries = self.pick(start);
            if tries.is_empty() {
                // Every report says full or draining: ask again before refusing.
                self.refresh_rooms(true).await;
                tries = self.pick(start);
            }
            if tries.is_empty() {
                return Err(self.no_room());
            }
            let mut last = None;
            for n in tries {
                // Counted at once, so forks placed before the next report spread out.
                self.rooms.lock().unwrap_or_else(|p| p.into_inner())[n]
                    .0
                    .placed();
                let result = self.members[n].1.fork(tag).await;
                let mut f = self.failed_until.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok(b) => {
                        f[n] = None;
                        return Ok(Self::prefixed(n, b));
                    }
                    Err(e) => {
                        f[n] = Some(Instant::now() + FAILED_FOR);
                        let e = self.named(n, e);
                        tracing::warn!(worker = n, error = %e, "fork failed on this worker; trying the next");
                        last = Some(e);
                    }
                }
            }
            Err(last.unwrap_or_else(|| ProviderError::Remote("no worker".into())))
        })
    }

    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let (n, p, id) = self.member(handle)?;
            match p.ensure_running(id).await {
                Ok(b) => Ok(Self::prefixed(n, b)),
                Err(e) => Err(self.named(n, e)),
            }
        })
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let (n, p, id) = self.member(handle)?;
            p.destroy(id).await.map_err(|e| self.named(n, e))
        })
    }

    fn stop<'a>(&'a self, _handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        // As for one service: the worker owns the sandbox's life; its TTL is the backstop.
        Box::pin(async { Ok(()) })
    }

    /// Every member's sandboxes. One member that cannot be listed fails the whole list: the
    /// janitor then acts on nothing, rather than ending tokens of a worker that is only slow.
    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for (n, (_, p)) in self.members.iter().enumerate() {
                let part = p.list().await.map_err(|e| self.named(n, e))?;
                out.extend(part.into_iter().map(|(h, t)| (format!("w{n}.{h}"), t)));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }

    fn secrets(&self) -> Vec<String> {
        self.members.iter().flat_map(|(_, p)| p.secrets()).collect()
    }

    /// A member that holds one already (no new sandbox), else a new one placed as a fork is
    /// (the goldens are the same SQL on every worker).
    fn reference<'a>(
        &'a self,
        golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let held: Vec<usize> = (0..self.members.len())
                .filter(|&i| self.members[i].1.holds_reference())
                .collect();
            let mut last = None;
            for &n in &held {
                match self.members[n].1.reference(golden).await {
                    Ok(b) => return Ok(Self::prefixed(n, b)),
                    Err(e) => last = Some(self.named(n, e)),
                }
            }
            self.refresh_rooms(false).await;
            let tries = self.pick(self.next.load(Ordering::Relaxed));
            if tries.is_empty() && last.is_none() {
                return Err(self.no_room());
            }
            for n in tries.into_iter().filter(|n| !held.contains(n)) {
                self.rooms.lock().unwrap_or_else(|p| p.into_inner())[n]
                    .0
                    .placed();
                match self.members[n].1.reference(golden).await {
                    Ok(b) => return Ok(Self::prefixed(n, b)),
                    Err(e) => last = Some(self.named(n, e)),
                }
            }
            Err(last.unwrap_or_else(|| ProviderError::Remote("no worker".into())))
        })
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async move {
            for (n, (_, p)) in self.members.iter().enumerate() {
                if let Err(e) = p.release_reference().await {
                    tracing::warn!(worker = n, error = %self.named(n, e), "releasing a review reference failed (its TTL reaps it)");
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{split, stale, Room, FAILED_FOR, ROOM_FRESH_FOR};

    #[test]
    fn handles_name_their_member() {
        assert_eq!(split("w0.sbx-1"), Some((0, "sbx-1")));
        assert_eq!(split("w12.a.b"), Some((12, "a.b")));
        assert_eq!(split("sbx-1"), None);
        assert_eq!(split("wx.sbx"), None);
        assert_eq!(split("w1"), None);
    }

    #[test]
    fn reports_are_asked_again_when_stale_and_dead_members_less_often() {
        let now = Instant::now();
        let ago = |d: Duration| Some(now.checked_sub(d).expect("uptime"));
        let (u, x) = (Room::Unreported, Room::Unreachable);
        assert!(stale(&u, None, now));
        assert!(!stale(&u, ago(Duration::from_millis(500)), now));
        assert!(stale(&u, ago(ROOM_FRESH_FOR), now));
        assert!(!stale(&x, ago(ROOM_FRESH_FOR), now));
        assert!(stale(&x, ago(FAILED_FOR), now));
    }
}
