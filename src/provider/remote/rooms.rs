//! What a front knows of its workers' room, and how it learns it: by asking each worker
//! (`GET /v1/capacity`, cached for a moment) or, with a shared registry, from the registry's
//! book (`book::RoomBook`), where fronts record the answers on the workers' behalf and count
//! every fork they place. Also which workers have stopped answering, and for how long: a
//! worker silent past `remote.worker_lost_after` is lost (`check`).

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::book::{Answer, RoomBook};
use super::place::{self, Room};
use super::RemoteProvider;
use crate::provider::fleet::LostWorker;
use crate::provider::ProviderError;

/// How long a member whose fork failed is tried after the others; also how often a worker
/// that did not answer is asked again.
pub(super) const FAILED_FOR: Duration = Duration::from_secs(10);
/// How long a capacity report is used before the member is asked again.
pub(super) const ROOM_FRESH_FOR: Duration = Duration::from_secs(2);
/// Longest wait for one capacity answer (asked of all due members at once).
const CAPACITY_WITHIN: Duration = Duration::from_secs(1);
/// A shared report older than this is ignored (the fronts asking every 2 s get no answer).
const IGNORE_AFTER: Duration = Duration::from_secs(10);

/// One member, as this front sees it.
#[derive(Debug, Clone, Copy)]
struct Member {
    room: Room,
    /// When this front last asked it (local mode).
    asked: Option<Instant>,
    /// Until when it is tried last, after a failed fork.
    failed_until: Option<Instant>,
    /// How long it has not answered, as of `seen_at`.
    unreachable: Option<(Duration, Instant)>,
    /// Declared lost (its tokens ended): destroys skip it, the janitor lists the others.
    lost: bool,
    /// The shared book says it is lost.
    book_lost: bool,
}

/// The members' room and health.
pub(super) struct Rooms {
    urls: Vec<String>,
    book: Option<Arc<dyn RoomBook>>,
    lost_after: Duration,
    members: Mutex<Vec<Member>>,
    /// One refresh at a time; forks arriving meanwhile wait for its answers.
    refreshing: tokio::sync::Mutex<()>,
}

/// Whether a member's room, asked at `asked`, is due to be asked again at `now`. A member
/// that could not be asked is asked again only after `FAILED_FOR`, so a dead worker does not
/// hold up a fork every `ROOM_FRESH_FOR`.
pub(super) fn stale(room: &Room, asked: Option<Instant>, now: Instant) -> bool {
    let fresh_for = match room {
        Room::Unreachable => FAILED_FOR,
        Room::Known(_) | Room::Unreported => ROOM_FRESH_FOR,
    };
    asked.is_none_or(|t| now.saturating_duration_since(t) >= fresh_for)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Rooms {
    pub(super) fn new(urls: Vec<String>) -> Rooms {
        let n = urls.len();
        let m = Member {
            room: Room::Unreported,
            asked: None,
            failed_until: None,
            unreachable: None,
            lost: false,
            book_lost: false,
        };
        Rooms {
            urls,
            book: None,
            lost_after: Duration::ZERO,
            members: Mutex::new(vec![m; n]),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn set_book(&mut self, book: Arc<dyn RoomBook>) {
        self.book = Some(book);
    }

    pub(super) fn set_lost_after(&mut self, after: Duration) {
        self.lost_after = after;
    }

    /// Whether member `n` was declared lost.
    pub(super) fn is_lost(&self, n: usize) -> bool {
        lock(&self.members).get(n).is_some_and(|m| m.lost)
    }

    /// Learns the members' room: asks those due (all with `force`) and, with a book,
    /// records the answers there and reads every row back.
    pub(super) async fn refresh(&self, services: &[(String, RemoteProvider)], force: bool) {
        if self.book.is_none() && !force && !self.any_due() {
            return;
        }
        let _one = self.refreshing.lock().await;
        let due: Vec<usize> = match &self.book {
            None => {
                let now = Instant::now();
                let m = lock(&self.members);
                (0..m.len())
                    .filter(|&i| force || stale(&m[i].room, m[i].asked, now))
                    .collect()
            }
            Some(_) if force => (0..self.urls.len()).collect(),
            Some(book) => match book.claim_due(&self.urls, ROOM_FRESH_FOR, FAILED_FOR).await {
                Ok(urls) => (0..self.urls.len())
                    .filter(|&i| urls.contains(&self.urls[i]))
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "reading which workers are due a capacity question failed");
                    Vec::new()
                }
            },
        };
        let asked_at = Instant::now();
        let answers: Vec<Answer> =
            futures_util::future::join_all(due.iter().map(|&i| async move {
                match services[i].1.capacity(CAPACITY_WITHIN).await {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::debug!(worker = i, error = %e, "capacity question failed");
                        None
                    }
                }
            }))
            .await;
        match &self.book {
            None => self.note_answers(&due, &answers, asked_at),
            Some(book) => {
                let rows: Vec<(String, Answer)> = due
                    .iter()
                    .zip(&answers)
                    .map(|(&i, a)| (self.urls[i].clone(), *a))
                    .collect();
                if !rows.is_empty() {
                    if let Err(e) = book.record(&rows).await {
                        tracing::warn!(error = %e, "recording workers' capacity in the registry failed");
                    }
                }
                self.warn_new_silence(&due, &answers);
                self.read_book(book.as_ref()).await;
            }
        }
    }

    /// Local mode: whether any member is due a question (a fork need not wait for the lock).
    fn any_due(&self) -> bool {
        let now = Instant::now();
        lock(&self.members)
            .iter()
            .any(|m| stale(&m.room, m.asked, now))
    }

    /// Local mode: the answers become the members' room.
    fn note_answers(&self, due: &[usize], answers: &[Answer], asked_at: Instant) {
        self.warn_new_silence(due, answers);
        let mut m = lock(&self.members);
        for (&i, a) in due.iter().zip(answers) {
            let was = m[i].unreachable;
            m[i].asked = Some(asked_at);
            m[i].room = match a {
                Some(Some(c)) => Room::Known(*c),
                Some(None) => Room::Unreported,
                None => Room::Unreachable,
            };
            m[i].unreachable = match (a, was) {
                (Some(_), _) => None,
                (None, Some((d, at))) => {
                    Some((d + asked_at.saturating_duration_since(at), asked_at))
                }
                (None, None) => Some((Duration::ZERO, asked_at)),
            };
        }
    }

    /// One warning when a worker stops answering (not one per question).
    fn warn_new_silence(&self, due: &[usize], answers: &[Answer]) {
        let m = lock(&self.members);
        for (&i, a) in due.iter().zip(answers) {
            if a.is_none() && m[i].unreachable.is_none() {
                tracing::warn!(worker = i, url = %self.urls[i], "worker does not answer its capacity question; it is tried last");
            }
        }
    }

    /// Before a fork: in local mode the members due are asked; with a book its rows are
    /// read (the fronts' watch keeps them fresh, so a fork asks no worker).
    pub(super) async fn before_fork(&self, services: &[(String, RemoteProvider)]) {
        match &self.book {
            None => self.refresh(services, false).await,
            Some(book) => self.read_book(book.as_ref()).await,
        }
    }

    /// Book mode: every row read back into the members' room.
    async fn read_book(&self, book: &dyn RoomBook) {
        let rows = match book.read(&self.urls).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading workers' capacity from the registry failed");
                return;
            }
        };
        let now = Instant::now();
        let mut m = lock(&self.members);
        for seen in rows {
            let Some(i) = self.urls.iter().position(|u| *u == seen.url) else {
                continue;
            };
            m[i].room = place::room_of(&seen, IGNORE_AFTER);
            m[i].unreachable = seen.unreachable_for.map(|d| (d, now));
            m[i].book_lost = seen.lost;
        }
    }

    /// The members to try, best first (see `place::order`): a member whose fork failed
    /// lately counts as unreachable unless its report already leaves it out.
    pub(super) fn pick(&self, start: usize) -> Vec<usize> {
        let now = Instant::now();
        let m = lock(&self.members);
        let seen: Vec<Room> = m
            .iter()
            .map(|x| match x.room {
                r if r.refuses() => r,
                _ if x.failed_until.is_some_and(|t| t > now) => Room::Unreachable,
                r => r,
            })
            .collect();
        place::order(&seen, start)
    }

    /// Counts a fork about to be placed on member `n`: at once in this front's view, and
    /// with a book in the shared row, where another front may have taken the last room
    /// (false: try the next member).
    pub(super) async fn take(&self, n: usize) -> bool {
        let known = {
            let mut m = lock(&self.members);
            let known = matches!(m[n].room, Room::Known(_));
            m[n].room.placed();
            known
        };
        match (&self.book, known) {
            (Some(book), true) => match book.reserve(&self.urls[n], IGNORE_AFTER).await {
                Ok(taken) => taken,
                Err(e) => {
                    tracing::warn!(worker = n, error = %e, "counting a fork in the registry failed; placing it anyway");
                    true
                }
            },
            _ => true,
        }
    }

    /// A fork on member `n` succeeded or failed (a failed one is tried last for a while).
    pub(super) fn forked(&self, n: usize, ok: bool) {
        let mut m = lock(&self.members);
        m[n].failed_until = (!ok).then(|| Instant::now() + FAILED_FOR);
        if !ok {
            // Until the next report: the worker holds nothing for a failed create.
            m[n].room.unplaced();
        }
    }

    /// The error when no member takes a new fork: which is full, which draining.
    pub(super) fn no_room(&self) -> ProviderError {
        let m = lock(&self.members);
        let why: Vec<String> = m
            .iter()
            .enumerate()
            .filter_map(|(i, x)| {
                x.room
                    .why_not()
                    .map(|w| format!("worker {i} ({}) {w}", self.urls[i]))
            })
            .collect();
        ProviderError::Remote(format!("no worker takes a new sandbox: {}", why.join(", ")))
    }

    /// After a refresh: the members newly lost (silent past `lost_after`, or declared lost
    /// by another front in the book); one that answers again is no longer lost.
    pub(super) async fn newly_lost(&self) -> Vec<LostWorker> {
        let now = Instant::now();
        let found: Vec<(usize, Duration, bool)> = {
            let mut m = lock(&self.members);
            let mut found = Vec::new();
            for (i, x) in m.iter_mut().enumerate() {
                let silent = x
                    .unreachable
                    .map(|(d, at)| d + now.saturating_duration_since(at));
                let lost = x.book_lost || place::is_lost(silent, self.lost_after);
                if lost && !x.lost {
                    x.lost = true;
                    found.push((i, silent.unwrap_or_default(), x.book_lost));
                } else if !lost && x.lost {
                    tracing::info!(worker = i, url = %self.urls[i], "a lost worker answers again; it takes new forks");
                    x.lost = false;
                }
            }
            found
        };
        let mut out = Vec::new();
        for (index, unreachable_for, marked_elsewhere) in found {
            let declared_here = match (&self.book, marked_elsewhere) {
                (_, true) => false,
                (None, false) => true,
                (Some(book), false) => match book.mark_lost(&self.urls[index]).await {
                    Ok(first) => first,
                    Err(e) => {
                        tracing::warn!(worker = index, error = %e, "marking a lost worker in the registry failed");
                        true
                    }
                },
            };
            out.push(LostWorker {
                index,
                url: self.urls[index].clone(),
                unreachable_for,
                declared_here,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{stale, Room, FAILED_FOR, ROOM_FRESH_FOR};

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
