//! Bounded work per wake-up. A session whose client floods it (a pipelined burst, a Query of
//! thousands of statements) always has a frame ready, and tokio's own cooperative budget
//! only counts socket reads, not the frames already buffered: without a turn of its own a
//! flooding session could hold a worker for thousands of frames while another token's
//! `select 1` waits. A turn is a number of frames; after it the session yields its worker.
//! The turn is shared out among the token's sessions, so a token with many busy sessions
//! gets about one session's share of a worker, not one share per session.

use crate::lifecycle::SessionSlot;

/// Frames a token's sessions may handle, together, per turn.
pub const FRAMES_PER_TURN: usize = 256;
/// The least a session gets per turn, however many sessions its token has.
pub const MIN_FRAMES: usize = 16;

/// Frames one session of a token with `sessions` open sessions may handle per turn.
pub fn quota(sessions: u32) -> usize {
    (FRAMES_PER_TURN / sessions.max(1) as usize).max(MIN_FRAMES)
}

/// One session's count of frames since it last yielded.
pub struct Turn<'a> {
    slot: Option<&'a SessionSlot>,
    spent: usize,
    /// This turn's quota, looked up when the turn started.
    quota: usize,
}

impl<'a> Turn<'a> {
    /// A session's turns; `slot` tells how many sessions its token has (None: alone).
    pub fn new(slot: Option<&'a SessionSlot>) -> Self {
        let quota = quota(slot.map_or(1, SessionSlot::token_sessions));
        Turn {
            slot,
            spent: 0,
            quota,
        }
    }

    /// `n` more frames handled.
    pub fn spend(&mut self, n: usize) {
        self.spent += n;
    }

    /// Frames left in this turn (at least one: the frame that woke the session).
    pub fn room(&self) -> usize {
        self.quota.saturating_sub(self.spent).max(1)
    }

    /// Whether this turn is used up; if so the next one starts (the caller yields now).
    pub fn over(&mut self) -> bool {
        if self.spent < self.quota {
            return false;
        }
        self.spent = 0;
        self.quota = quota(self.slot.map_or(1, SessionSlot::token_sessions));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_table() {
        for (sessions, frames) in [
            (0, 256),
            (1, 256),
            (2, 128),
            (3, 85),
            (16, 16),
            (17, MIN_FRAMES),
            (10_000, MIN_FRAMES),
        ] {
            assert_eq!(quota(sessions), frames, "{sessions} sessions");
        }
    }

    #[test]
    fn a_lone_session_yields_after_each_full_turn() {
        let mut t = Turn::new(None);
        // (frames handled, whether the turn is then over, room left after asking)
        for (i, (n, over, room)) in [
            (1, false, 255),
            (128, false, 127),
            (127, true, 256),
            (0, false, 256),
            (300, true, 256),
            (255, false, 1),
            (1, true, 256),
        ]
        .into_iter()
        .enumerate()
        {
            t.spend(n);
            assert_eq!(t.over(), over, "step {i}");
            assert_eq!(t.room(), room, "step {i}");
        }
    }
}
