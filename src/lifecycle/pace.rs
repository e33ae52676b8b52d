//! The pace of a token's new sessions: `burst` at once, then `rate` per second. Each new
//! session makes the scratch server start a backend process (and the gateway a login), on
//! the cores every other token shares; a token looping over logins would otherwise take them
//! all. Neon's proxy limits connection attempts per endpoint the same way; here a login
//! over the pace waits its turn (a pool opening its connections still succeeds) and is
//! refused only when its turn is further away than the caller will wait.
//!
//! One instant per token (GCRA: the theoretical arrival time), O(1) per login, no I/O: the
//! caller passes the clock. With a shared registry the instant is a row there instead, so
//! every front paces a token as one (`registry::limits`).

use std::time::{Duration, Instant};

/// What a new session is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Start now.
    Now,
    /// Start after this long (its turn is reserved).
    After(Duration),
    /// Its turn is further away than the caller would wait; nothing was reserved.
    Refused,
}

impl Turn {
    /// From a wait before the start (zero: now), `None` when refused (the registry's answer).
    pub fn from_wait(wait: Option<Duration>) -> Turn {
        match wait {
            None => Turn::Refused,
            Some(w) if w.is_zero() => Turn::Now,
            Some(w) => Turn::After(w),
        }
    }
}

/// The pace's parameters for `rate` sessions a second after a `burst`: the interval between
/// sessions (zero: no pace) and how far ahead of the sustained rate a burst may run.
pub fn params(rate: u32, burst: u32) -> (Duration, Duration) {
    let interval = if rate == 0 {
        Duration::ZERO
    } else {
        Duration::from_secs(1) / rate
    };
    (interval, interval * burst.saturating_sub(1))
}

/// The GCRA step, the one place its arithmetic lives (the shared registry's statement,
/// `registry::limits`, mirrors it in SQL, and a test checks both agree). Times are offsets
/// from any common origin: `tat` the token's theoretical arrival time (None: never used),
/// `now` the clock. Returns what the session is told and the new `tat` (unchanged when
/// refused: nothing is reserved).
pub fn step(
    tat: Option<Duration>,
    now: Duration,
    interval: Duration,
    tolerance: Duration,
    max_wait: Duration,
) -> (Turn, Option<Duration>) {
    if interval.is_zero() {
        return (Turn::Now, tat);
    }
    let tat_now = tat.map_or(now, |t| t.max(now));
    // The earliest start the burst allows for this session.
    let start = tat_now.saturating_sub(tolerance).max(now);
    let wait = start - now;
    if wait > max_wait {
        return (Turn::Refused, tat);
    }
    let turn = if wait.is_zero() {
        Turn::Now
    } else {
        Turn::After(wait)
    };
    (turn, Some(tat_now + interval))
}

/// One token's pace in this process (one gateway; with a shared registry the registry
/// keeps it, see `registry::limits`).
#[derive(Debug)]
pub struct Pace {
    interval: Duration,
    tolerance: Duration,
    /// Times are offsets from this instant.
    origin: Instant,
    tat: Option<Duration>,
}

impl Pace {
    /// `rate` sessions a second after a `burst`; a rate of 0 turns pacing off.
    pub fn new(rate: u32, burst: u32) -> Self {
        let (interval, tolerance) = params(rate, burst);
        Pace {
            interval,
            tolerance,
            origin: Instant::now(),
            tat: None,
        }
    }

    /// A new session at `now`, which will wait at most `max_wait` for its turn.
    pub fn admit(&mut self, now: Instant, max_wait: Duration) -> Turn {
        // An instant before the origin (a caller's clock read earlier) counts as the origin.
        let at = now.saturating_duration_since(self.origin);
        let (turn, tat) = step(self.tat, at, self.interval, self.tolerance, max_wait);
        self.tat = tat;
        turn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_burst_then_the_rate_then_refusals() {
        // 10 a second (one every 100 ms) after a burst of 3; callers wait up to 250 ms.
        let mut p = Pace::new(10, 3);
        let t0 = Instant::now();
        // (ms since t0, what the session is told)
        for (i, (at, turn)) in [
            (0, Turn::Now),
            (0, Turn::Now),
            (0, Turn::Now),
            (0, Turn::After(MS(100))),
            (0, Turn::After(MS(200))),
            (0, Turn::Refused),
            (50, Turn::After(MS(250))),
            (50, Turn::Refused),
            // Refusals reserved nothing: at 400 ms the next turn is the one after 50 ms's.
            (400, Turn::Now),
            // Idle since: the whole burst again.
            (1_000, Turn::Now),
            (1_000, Turn::Now),
            (1_000, Turn::Now),
            (1_000, Turn::After(MS(100))),
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(p.admit(t0 + MS(at), MS(250)), turn, "step {i} at {at} ms");
        }
    }

    #[test]
    fn an_idle_token_gets_its_whole_burst_back_and_no_more() {
        let mut p = Pace::new(100, 5);
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(p.admit(t0, Duration::ZERO), Turn::Now);
        }
        assert_eq!(p.admit(t0, Duration::ZERO), Turn::Refused);
        // An hour idle: the burst again, not an hour's worth of sessions.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..5 {
            assert_eq!(p.admit(later, Duration::ZERO), Turn::Now);
        }
        assert_eq!(p.admit(later, Duration::ZERO), Turn::Refused);
    }

    #[test]
    fn rate_zero_is_off_and_burst_zero_means_one() {
        let mut off = Pace::new(0, 0);
        let t0 = Instant::now();
        for _ in 0..10_000 {
            assert_eq!(off.admit(t0, Duration::ZERO), Turn::Now);
        }
        let mut one = Pace::new(2, 0);
        assert_eq!(one.admit(t0, Duration::ZERO), Turn::Now);
        assert_eq!(one.admit(t0, MS(600)), Turn::After(MS(500)));
    }
}
