//! Where a new fork goes among several workers (`remote.urls`): a pure choice from what the
//! front last saw of each worker's room, with no I/O, so it is table-tested on its own.

use super::api::Capacity;

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

    /// Counts one fork placed on it, until its next report says what it really holds.
    pub(super) fn placed(&mut self) {
        if let Room::Known(c) = self {
            c.sandboxes = c.sandboxes.saturating_add(1);
            c.warm = c.warm.saturating_sub(1);
        }
    }
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
        Room::Known(c) => {
            let free = c.max_sandboxes - c.sandboxes;
            (0u8, u8::from(c.warm == 0), u64::MAX - free)
        }
        Room::Unreported => (1, 0, 0),
        Room::Unreachable => (2, 0, 0),
    });
    all
}

#[cfg(test)]
mod tests {
    use super::{order, Room};
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
        let mut u = Room::Unreported;
        u.placed();
        assert_eq!(u, Room::Unreported);
        assert_eq!(cap(2, 0, 0, true).why_not().as_deref(), Some("draining"));
    }
}
