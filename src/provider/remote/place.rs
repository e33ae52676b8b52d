//! Where a new fork goes among several workers (`remote.urls`): a pure choice from what the
//! front last saw of each worker's room, with no I/O, so it is table-tested on its own; and
//! what a row of the shared registry's book says of a worker (`room_of`, `is_lost`).

use std::time::Duration;

use super::api::Capacity;
use super::book::{Report, Seen};

/// What a front knows of one worker's room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// Its capacity report (adjusted for the forks this front placed since).
    Known(Capacity),
    /// It does not report capacity (a sandbox service that is not a sandpit worker).
    Unreported,
    /// It could not be asked lately, or a fork on it failed lately: tried last.
    Unreachable,
}

impl Room {
    /// Whether a worker with this report takes no new fork at all (draining or full).
    pub(super) fn refuses(&self) -> bool {
        match self {
            Room::Known(c) => c.draining || c.sandboxes >= c.max_sandboxes,
            Room::Unreported | Room::Unreachable => false,
        }
    }

    /// Why it refuses, for the error when every worker does.
    pub(super) fn why_not(&self) -> Option<String> {
        match self {
            Room::Known(c) if c.draining => Some("draining".into()),
            Room::Known(c) if c.sandboxes >= c.max_sandboxes => Some(format!(
                "full ({} of {} sandboxes)",
                c.sandboxes, c.max_sandboxes
            )),
            _ => None,
        }
    }

    /// Uncounts a fork placed on it that failed (a failed create holds nothing there).
    pub(super) fn unplaced(&mut self) {
        if let Room::Known(c) = self {
            c.sandboxes = c.sandboxes.saturating_sub(1);
        }
    }

    /// Counts one fork placed on it, until its next report says what it really holds.
    pub(super) fn placed(&mut self) {
        if let Room::Known(c) = self {
            c.sandboxes = c.sandboxes.saturating_add(1);
            c.warm = c.warm.saturating_sub(1);
        }
    }
}

/// A worker's free room in steps of a sixteenth of its size (at least 1): workers whose room
/// differs by less than a step count as equal and take turns, so forks placed at the same
/// moment (by several fronts, or before the next report) spread out instead of all landing on
/// the one with a single free slot more.
fn free_steps(c: &Capacity) -> u64 {
    let step = (c.max_sandboxes / 16).max(1);
    c.max_sandboxes.saturating_sub(c.sandboxes) / step
}

/// The order to try workers in for a new fork. First those that report room: a ready warm
/// member first (its claim is the fastest fork), then the most free room (`max_sandboxes −
/// sandboxes`); then those that do not report capacity; last those that failed lately.
/// Ties go round-robin from `start`, so equal workers take turns. Draining and full workers
/// are left out: they get no new fork.
pub(super) fn order(rooms: &[Room], start: usize) -> Vec<usize> {
    let n = rooms.len();
    let mut all: Vec<usize> = (0..n)
        .map(|k| (start + k) % n.max(1))
        .filter(|&i| !rooms[i].refuses())
        .collect();
    // Stable: the round-robin order stays within equal keys.
    all.sort_by_key(|&i| match rooms[i] {
        Room::Known(c) => (0u8, u8::from(c.warm == 0), u64::MAX - free_steps(&c)),
        Room::Unreported => (1, 0, 0),
        Room::Unreachable => (2, 0, 0),
    });
    all
}

/// A worker's room as a shared-registry row says it. A report older than `ignore_after`
/// (the fronts that ask every 2 s have stopped getting answers) is ignored: the worker is
/// tried last, as one that could not be asked, and so is one whose last question failed.
pub(super) fn room_of(seen: &Seen, ignore_after: Duration) -> Room {
    let stale = seen.age.is_none_or(|a| a >= ignore_after);
    match seen.report {
        _ if seen.lost || seen.unreachable_for.is_some() || stale => Room::Unreachable,
        Report::None => Room::Unreachable,
        Report::Unreported => Room::Unreported,
        Report::Capacity(c) => Room::Known(c),
    }
}

/// Whether a worker that has answered no question for `unreachable_for` is lost, with
/// `remote.worker_lost_after` = `after` (zero: never).
pub(super) fn is_lost(unreachable_for: Option<Duration>, after: Duration) -> bool {
    !after.is_zero() && unreachable_for.is_some_and(|u| u >= after)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{is_lost, order, room_of, Room};
    use crate::provider::remote::book::{Report, Seen};
    use crate::provider::remote_api::Capacity;

    fn cap(max: u64, held: u64, warm: u64, draining: bool) -> Room {
        Room::Known(Capacity {
            max_sandboxes: max,
            sandboxes: held,
            warm,
            draining,
        })
    }

    #[test]
    fn forks_go_where_there_is_most_room() {
        let (u, x) = (Room::Unreported, Room::Unreachable);
        // (rooms, start, order)
        let table: Vec<(Vec<Room>, usize, Vec<usize>)> = vec![
            // Most free room first.
            (
                vec![cap(10, 8, 0, false), cap(10, 2, 0, false)],
                0,
                vec![1, 0],
            ),
            (
                vec![cap(10, 2, 0, false), cap(4, 0, 0, false)],
                0,
                vec![0, 1],
            ),
            // Room within a sixteenth of the size counts as equal: round-robin.
            (
                vec![cap(1000, 40, 0, false), cap(1000, 10, 0, false)],
                0,
                vec![0, 1],
            ),
            (
                vec![cap(1000, 40, 0, false), cap(1000, 10, 0, false)],
                1,
                vec![1, 0],
            ),
            (
                vec![cap(1000, 100, 0, false), cap(1000, 10, 0, false)],
                0,
                vec![1, 0],
            ),
            // Equal room: round-robin from start.
            (
                vec![cap(10, 2, 0, false), cap(10, 2, 0, false)],
                0,
                vec![0, 1],
            ),
            (
                vec![cap(10, 2, 0, false), cap(10, 2, 0, false)],
                1,
                vec![1, 0],
            ),
            // A warm member beats more free room.
            (
                vec![cap(10, 0, 0, false), cap(10, 9, 1, false)],
                0,
                vec![1, 0],
            ),
            // Full and draining workers get nothing, whatever their warm pool.
            (vec![cap(1, 1, 2, false), cap(10, 5, 0, false)], 0, vec![1]),
            (vec![cap(10, 0, 3, true), cap(10, 9, 0, false)], 0, vec![1]),
            (vec![cap(1, 1, 0, false), cap(2, 0, 0, true)], 0, vec![]),
            // Reported room, then unreported (round-robin among them), then failed lately.
            (vec![x, u, cap(10, 9, 0, false), u], 1, vec![2, 1, 3, 0]),
            (vec![u, u, u], 2, vec![2, 0, 1]),
            (vec![x, cap(3, 3, 0, false)], 0, vec![0]),
            (vec![], 0, vec![]),
        ];
        for (rooms, start, want) in table {
            assert_eq!(order(&rooms, start), want, "{rooms:?} from {start}");
        }
    }

    #[test]
    fn a_placed_fork_counts_until_the_next_report() {
        let mut r = cap(2, 1, 1, false);
        r.placed();
        assert_eq!(r, cap(2, 2, 0, false));
        assert_eq!(r.why_not().as_deref(), Some("full (2 of 2 sandboxes)"));
        assert_eq!(order(&[r, cap(5, 4, 0, false)], 0), vec![1]);
        r.unplaced();
        assert_eq!(r, cap(2, 1, 0, false));
        let mut u = Room::Unreported;
        u.placed();
        assert_eq!(u, Room::Unreported);
        assert_eq!(cap(2, 0, 0, true).why_not().as_deref(), Some("draining"));
    }

    #[test]
    fn registry_rows_become_rooms_and_stale_ones_are_ignored() {
        let s = Duration::from_secs;
        let c = crate::provider::remote_api::Capacity {
            max_sandboxes: 4,
            sandboxes: 1,
            warm: 0,
            draining: false,
        };
        let row = |report, age: Option<u64>, unreachable: Option<u64>, lost| Seen {
            url: "u".into(),
            report,
            age: age.map(s),
            unreachable_for: unreachable.map(s),
            lost,
        };
        let cap = Report::Capacity(c);
        // (row, room with reports ignored after 10 s)
        let table = vec![
            (row(cap, Some(1), None, false), Room::Known(c)),
            (row(cap, Some(9), None, false), Room::Known(c)),
            // Stale: nobody got an answer lately.
            (row(cap, Some(10), None, false), Room::Unreachable),
            (row(cap, None, None, false), Room::Unreachable),
            // Its last question failed, or it was declared lost: tried last.
            (row(cap, Some(1), Some(3), false), Room::Unreachable),
            (row(cap, Some(1), None, true), Room::Unreachable),
            (
                row(Report::Unreported, Some(1), None, false),
                Room::Unreported,
            ),
            (
                row(Report::Unreported, Some(30), None, false),
                Room::Unreachable,
            ),
            (row(Report::None, None, None, false), Room::Unreachable),
        ];
        for (seen, want) in table {
            assert_eq!(room_of(&seen, s(10)), want, "{seen:?}");
        }
    }

    #[test]
    fn a_worker_is_lost_past_the_grace_unless_the_grace_is_zero() {
        let s = Duration::from_secs;
        // (unreachable for, worker_lost_after, lost)
        let table = [
            (None, s(60), false),
            (Some(s(59)), s(60), false),
            (Some(s(60)), s(60), true),
            (Some(s(600)), s(60), true),
            (Some(s(600)), s(0), false),
        ];
        for (u, after, want) in table {
            assert_eq!(is_lost(u, after), want, "{u:?} {after:?}");
        }
    }
}
