//! Authentication failure rate limiting, per source address and per token id.
//!
//! A sliding one-minute window (the previous minute's count weighted by how much of it
//! still overlaps, plus the current minute's count) per key. Over the limit, a connection is
//! refused before its credentials are even looked at, so guessing secrets costs the guesser
//! a minute per `limit` attempts from one address and per token.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use dashmap::DashMap;

/// Length of one window.
const WINDOW: Duration = Duration::from_secs(60);
/// Past this many tracked keys, stale ones are dropped on insert (bounds memory under a
/// spray of addresses or made-up token ids).
const PRUNE_AT: usize = 50_000;

/// What is counted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// A client address.
    Addr(IpAddr),
    /// A token id (as given in the user name; made-up ids count too).
    Token(String),
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    current: u32,
    previous: u32,
}

impl Window {
    /// Roll the window forward to `now`.
    fn roll(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.start);
        if age >= WINDOW * 2 {
            *self = Window {
                start: now,
                current: 0,
                previous: 0,
            };
        } else if age >= WINDOW {
            self.previous = self.current;
            self.current = 0;
            self.start += WINDOW;
        }
    }

    /// Failures in the minute before `now` (sliding estimate).
    fn estimate(&self, now: Instant) -> f64 {
        let into = now.saturating_duration_since(self.start).as_secs_f64() / WINDOW.as_secs_f64();
        let overlap = (1.0 - into).clamp(0.0, 1.0);
        self.previous as f64 * overlap + self.current as f64
    }
}

/// Failure counters of one listener.
pub struct AuthLimiter {
    per_minute: u32,
    windows: DashMap<Key, Window>,
}

impl AuthLimiter {
    /// A limiter allowing `per_minute` failures per key; 0 turns it off.
    pub fn new(per_minute: u32) -> AuthLimiter {
        AuthLimiter {
            per_minute,
            windows: DashMap::new(),
        }
    }

    /// Whether any of `keys` is over its limit now.
    pub fn limited(&self, keys: &[Key]) -> bool {
        if self.per_minute == 0 {
            return false;
        }
        let now = Instant::now();
        keys.iter().any(|k| {
            self.windows.get_mut(k).is_some_and(|mut w| {
                w.roll(now);
                w.estimate(now) >= self.per_minute as f64
            })
        })
    }

    /// Count one failed authentication against each of `keys`.
    pub fn failed(&self, keys: &[Key]) {
        if self.per_minute == 0 {
            return;
        }
        let now = Instant::now();
        if self.windows.len() >= PRUNE_AT {
            self.windows
                .retain(|_, w| now.saturating_duration_since(w.start) < WINDOW * 2);
        }
        for k in keys {
            let mut w = self.windows.entry(k.clone()).or_insert(Window {
                start: now,
                current: 0,
                previous: 0,
            });
            w.roll(now);
            w.current = w.current.saturating_add(1);
        }
    }

    /// Keys tracked now (for tests and metrics).
    pub fn tracked(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_key_and_slides() {
        let l = AuthLimiter::new(3);
        let a = Key::Addr("127.0.0.2".parse().unwrap());
        let b = Key::Addr("127.0.0.3".parse().unwrap());
        let t = Key::Token("tok".into());
        for _ in 0..3 {
            assert!(!l.limited(&[a.clone(), t.clone()]));
            l.failed(&[a.clone(), t.clone()]);
        }
        assert!(l.limited(std::slice::from_ref(&a)));
        assert!(
            l.limited(&[b.clone(), t.clone()]),
            "the token is limited from anywhere"
        );
        assert!(!l.limited(std::slice::from_ref(&b)));

        // A window that is a minute and a half old counts half.
        let now = Instant::now();
        let mut w = Window {
            start: now - Duration::from_secs(90),
            current: 4,
            previous: 0,
        };
        w.roll(now);
        assert_eq!((w.previous, w.current), (4, 0));
        let e = w.estimate(now);
        assert!((1.9..=2.1).contains(&e), "{e}");
        let mut old = Window {
            start: now - Duration::from_secs(200),
            current: 9,
            previous: 9,
        };
        old.roll(now);
        assert_eq!(old.estimate(now), 0.0);
    }

    #[test]
    fn zero_turns_it_off_and_memory_is_bounded() {
        let off = AuthLimiter::new(0);
        let k = Key::Token("x".into());
        for _ in 0..100 {
            off.failed(std::slice::from_ref(&k));
        }
        assert!(!off.limited(&[k]));
        assert_eq!(off.tracked(), 0);
    }
}
