//! The statement clock: which requests still wait for their ReadyForQuery, since when the
//! oldest has waited, and when the gateway's statement timeout cancels it. No I/O: the relay
//! feeds it message tags and moves its one timer ([`Alarm`]) to the deadline it names.

use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::proxy::gate::{Gate, Wait};

/// Requests (Query, Sync, FunctionCall) not yet answered, and since when the oldest
/// unanswered work has been waiting.
#[derive(Debug)]
pub struct StatementClock {
    /// How long a request may run; None: no watchdog, so no deadline.
    limit: Option<Duration>,
    unanswered: u64,
    busy_since: Option<Instant>,
    /// The running request was cancelled already: no second cancel for it.
    cancelled: bool,
}

/// What the timer's firing means.
#[derive(Debug, PartialEq, Eq)]
pub enum Fired {
    /// Nothing is timed any more.
    Idle,
    /// It fired for an earlier request: wait on for this deadline.
    Early(Instant),
    /// The request ran past its deadline: cancel it (once).
    Overdue,
}

impl StatementClock {
    /// A clock for a session whose requests may run `limit` (None: never timed out).
    pub fn new(limit: Option<Duration>) -> Self {
        StatementClock {
            limit,
            unanswered: 0,
            busy_since: None,
            cancelled: false,
        }
    }

    /// A client message starts the clock if nothing was running; Query, Sync and
    /// FunctionCall each owe one ReadyForQuery. `now` is asked only when the clock starts
    /// (one clock read per request, not per message).
    #[inline]
    pub fn client_sent(&mut self, tag: u8, now: impl FnOnce() -> Instant) {
        if matches!(tag, b'X' | b'd' | b'c' | b'f') {
            return; // Terminate and COPY data are not requests
        }
        if matches!(tag, b'Q' | b'S' | b'F') {
            self.unanswered += 1;
        }
        self.busy_since.get_or_insert_with(now);
    }

    /// ReadyForQuery answers one request; the clock restarts for the next one, if any.
    #[inline]
    pub fn backend_sent(&mut self, tag: u8, now: impl FnOnce() -> Instant) {
        if tag != b'Z' {
            return;
        }
        self.unanswered = self.unanswered.saturating_sub(1);
        self.cancelled = false;
        self.busy_since = (self.unanswered > 0).then(now);
    }

    /// Syncs the server ignored (sent inside COPY FROM STDIN) are never answered.
    #[inline]
    pub fn never_answered(&mut self, syncs: u64) {
        self.unanswered = self.unanswered.saturating_sub(syncs);
    }

    /// When the running request is to be cancelled; None when nothing runs, it was
    /// cancelled already, or there is no watchdog.
    #[inline]
    pub fn deadline(&self) -> Option<Instant> {
        match (self.limit, self.busy_since) {
            (Some(limit), Some(t)) if !self.cancelled => Some(t + limit),
            _ => None,
        }
    }

    /// The timer fired; `now` is asked only when something is timed.
    pub fn fired(&mut self, now: impl FnOnce() -> Instant) -> Fired {
        match self.deadline() {
            None => Fired::Idle,
            Some(d) if now() < d => Fired::Early(d),
            Some(_) => {
                self.cancelled = true;
                Fired::Overdue
            }
        }
    }
}

/// The session's one statement timer, moved only when it must fire earlier: arming and
/// dropping a timer per request costs more than the rest of a small round trip's
/// bookkeeping. Gated: polled only when it fired or was moved.
pub struct Alarm {
    timer: Gate<Sleep>,
    armed: bool,
}

impl Alarm {
    /// An alarm not yet set.
    pub fn new() -> Self {
        Alarm {
            timer: Gate::new(tokio::time::sleep(Duration::ZERO)),
            armed: false,
        }
    }

    /// Whether it is set (its firing is worth waiting for).
    #[inline]
    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Set no later than `deadline`; a later deadline (the next request's) is left to the
    /// firing, which moves the timer on.
    #[inline]
    pub fn arm_by(&mut self, deadline: Option<Instant>) {
        if let Some(d) = deadline {
            if !self.armed || self.timer.inner().deadline() > d {
                self.set(d);
            }
        }
    }

    /// Set to fire at `d`.
    pub fn set(&mut self, d: Instant) {
        self.timer.inner().reset(d);
        self.timer.rearm();
        self.armed = true;
    }

    /// Its firing (for a `select!` branch); [`Alarm::went_off`] follows it.
    #[inline]
    pub fn wait(&mut self) -> Wait<'_, Sleep> {
        self.timer.wait()
    }

    /// It fired: unset until set again.
    pub fn went_off(&mut self) {
        self.armed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);

    /// What the timer's firing should mean, deadlines in seconds after the start.
    #[derive(Clone, Copy)]
    enum Want {
        Idle,
        Early(u64),
        Overdue,
    }

    /// One step of a session, at a time in seconds after the start: a message from either
    /// side, Syncs found ignored, or the timer firing.
    #[derive(Clone, Copy)]
    enum Step {
        Client(u8, u64),
        Backend(u8, u64),
        Ignored(u64),
        Fire(u64, Want),
    }
    use Step::*;

    /// Runs `steps`, each with the deadline it leaves (seconds after the start) and whether
    /// it read the clock: only a request that starts the clock, or restarts it, does.
    fn run(limit: Option<Duration>, steps: &[(Step, Option<u64>, bool)]) {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut c = StatementClock::new(limit);
        for (i, &(step, deadline, reads_clock)) in steps.iter().enumerate() {
            let mut read = false;
            let mut now = |s: u64| {
                read = true;
                at(s)
            };
            match step {
                Client(tag, s) => c.client_sent(tag, || now(s)),
                Backend(tag, s) => c.backend_sent(tag, || now(s)),
                Ignored(n) => c.never_answered(n),
                Fire(s, want) => {
                    let want = match want {
                        Want::Idle => Fired::Idle,
                        Want::Early(d) => Fired::Early(at(d)),
                        Want::Overdue => Fired::Overdue,
                    };
                    assert_eq!(c.fired(|| now(s)), want, "step {i}");
                }
            }
            assert_eq!(c.deadline(), deadline.map(at), "step {i}: deadline");
            assert_eq!(read, reads_clock, "step {i}: clock read");
        }
    }

    #[test]
    fn a_request_is_timed_from_its_first_message_to_its_ready_for_query() {
        run(
            Some(LIMIT),
            &[
                // Parse/Bind/Execute start the clock (once), Sync owes the ReadyForQuery.
                (Client(b'P', 1), Some(11), true),
                (Client(b'B', 2), Some(11), false),
                (Client(b'E', 2), Some(11), false),
                (Client(b'S', 3), Some(11), false),
                (Backend(b'1', 4), Some(11), false),
                (Backend(b'C', 4), Some(11), false),
                (Backend(b'Z', 5), None, false),
                // Terminate and COPY data are not requests.
                (Client(b'd', 6), None, false),
                (Client(b'c', 6), None, false),
                (Client(b'f', 6), None, false),
                (Client(b'X', 6), None, false),
                // A stray ReadyForQuery does not go below zero.
                (Backend(b'Z', 7), None, false),
                (Client(b'Q', 8), Some(18), true),
                (Backend(b'Z', 9), None, false),
            ],
        );
    }

    #[test]
    fn pipelined_requests_restart_the_clock_at_each_answer() {
        run(
            Some(LIMIT),
            &[
                (Client(b'Q', 0), Some(10), true),
                (Client(b'Q', 1), Some(10), false),
                (Client(b'F', 1), Some(10), false),
                // One answered: the next is timed from now.
                (Backend(b'Z', 4), Some(14), true),
                (Backend(b'Z', 6), Some(16), true),
                (Backend(b'Z', 7), None, false),
            ],
        );
    }

    #[test]
    fn syncs_inside_copy_are_never_answered() {
        run(
            Some(LIMIT),
            &[
                (Client(b'Q', 0), Some(10), true),
                (Client(b'S', 1), Some(10), false),
                (Client(b'S', 1), Some(10), false),
                (Ignored(2), Some(10), false),
                (Backend(b'Z', 3), None, false),
                // More ignored than owed: none owed.
                (Client(b'Q', 4), Some(14), true),
                (Ignored(5), Some(14), false),
                (Backend(b'Z', 5), None, false),
            ],
        );
    }

    #[test]
    fn the_timer_cancels_once_and_waits_on_for_a_later_deadline() {
        run(
            Some(LIMIT),
            &[
                // Fired with nothing timed: nothing to do, no clock read.
                (Fire(0, Want::Idle), None, false),
                (Client(b'Q', 0), Some(10), true),
                (Client(b'Q', 1), Some(10), false),
                (Backend(b'Z', 5), Some(15), true),
                // Set for the first request's deadline, it fires before this one's.
                (Fire(10, Want::Early(15)), Some(15), true),
                (Fire(15, Want::Overdue), None, true),
                // Cancelled: no second cancel until the answer comes.
                (Fire(20, Want::Idle), None, false),
                (Client(b'Q', 21), None, false),
                (Backend(b'Z', 22), Some(32), true),
                (Backend(b'Z', 23), None, false),
            ],
        );
    }

    #[test]
    fn without_a_watchdog_nothing_has_a_deadline() {
        run(
            None,
            &[
                (Client(b'Q', 0), None, true),
                (Fire(20, Want::Idle), None, false),
                (Backend(b'Z', 30), None, false),
            ],
        );
    }
}
