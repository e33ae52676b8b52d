//! Authentication failure rate limiting that never refuses a valid credential.
//!
//! Two kinds of failure are counted, each against its own key, so no budget is shared by
//! everyone behind one address (loopback, a sidecar, a NAT):
//! - a wrong secret for a token id that exists counts against that token id;
//! - an id that does not exist (or a cleartext password that is no token) counts against the
//!   client's address (an IPv6 address by its /64, which one host usually owns whole).
//!
//! Nothing is refused before the credentials are checked, and a correct secret always
//! passes. A failure whose key is over the limit is answered late ([`TARPIT`]) with
//! `too many authentication failures`: that bounds what a failing client can make the
//! gateway do per second on one connection. (The secret has 256 bits; the limiter bounds the
//! cost of failures, it is not what stops guessing.)
//!
//! Each key has a sliding one-minute window (the previous minute's count weighted by how much
//! of it still overlaps, plus the current minute's count).
//!
//! This limiter is one process's. Fronts sharing a registry count failures there as well
//! (`registry::limits`, the same window in SQL), so failures spread over fronts are limited
//! as one; this one still counts each front's and decides when the registry cannot answer.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use dashmap::DashMap;

/// Length of one window.
const WINDOW: Duration = Duration::from_secs(60);
/// Past this many tracked keys, stale ones are dropped on insert; if that is not enough, new
/// keys are not tracked (bounds memory under a spray of addresses).
const MAX_KEYS: usize = 50_000;
/// How long a failure over the limit waits before it is answered.
pub const TARPIT: Duration = Duration::from_secs(1);

/// One failed authentication, by what it is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// An unknown token id (or a password that is not a token) from this address.
    Addr(IpAddr),
    /// A wrong secret for this existing token id.
    Token(String),
}

impl Key {
    /// The key for an unknown id from `addr`: IPv6 addresses count by their /64.
    pub fn unknown_from(addr: IpAddr) -> Key {
        match addr {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Key::Addr(IpAddr::V4(v4)),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    Key::Addr(IpAddr::V6(bits.into()))
                }
            },
            v4 => Key::Addr(v4),
        }
    }

    /// The key's spelling in the shared registry (`registry::limits`): kinds never collide.
    pub fn spelling(&self) -> String {
        match self {
            Key::Addr(a) => format!("addr:{a}"),
            Key::Token(t) => format!("token:{t}"),
        }
    }
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
    max_keys: usize,
    windows: DashMap<Key, Window>,
}

impl AuthLimiter {
    /// A limiter allowing `per_minute` failures per key; 0 turns it off.
    pub fn new(per_minute: u32) -> AuthLimiter {
        AuthLimiter {
            per_minute,
            max_keys: MAX_KEYS,
            windows: DashMap::new(),
        }
    }

    /// Count one failed authentication against `key`; true when `key` was already over its
    /// limit (the caller answers this failure late and says why).
    pub fn failed(&self, key: &Key) -> bool {
        self.failed_at(key, Instant::now())
    }

    fn failed_at(&self, key: &Key, now: Instant) -> bool {
        if self.per_minute == 0 {
            return false;
        }
        if !self.windows.contains_key(key) && self.windows.len() >= self.max_keys {
            self.windows
                .retain(|_, w| now.saturating_duration_since(w.start) < WINDOW * 2);
            if self.windows.len() >= self.max_keys {
                // Still full of live keys: this one goes uncounted rather than grow the map.
                return false;
            }
        }
        let mut w = self.windows.entry(key.clone()).or_insert(Window {
            start: now,
            current: 0,
            previous: 0,
        });
        w.roll(now);
        let over = w.estimate(now) >= self.per_minute as f64;
        w.current = w.current.saturating_add(1);
        over
    }

    /// The failures allowed per key and minute (0: off).
    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Keys tracked now (for tests and metrics).
    pub fn tracked(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Key {
        Key::unknown_from(s.parse().unwrap())
    }

    fn token(s: &str) -> Key {
        Key::Token(s.into())
    }

    /// Failures in order, each with whether it is answered as over the limit.
    #[test]
    fn each_key_has_its_own_budget() {
        struct Case {
            name: &'static str,
            limit: u32,
            failures: Vec<(Key, bool)>,
        }
        let a = || addr("127.0.0.1");
        let cases = [
            Case {
                name: "unknown ids from one address: limited past the limit",
                limit: 2,
                failures: vec![(a(), false), (a(), false), (a(), true), (a(), true)],
            },
            Case {
                name: "wrong secrets for a real id do not use the address's budget",
                limit: 2,
                failures: vec![
                    (a(), false),
                    (a(), false),
                    (token("t1"), false),
                    (token("t1"), false),
                    (token("t1"), true),
                    (a(), true),
                ],
            },
            Case {
                name: "one token's failures do not limit another token",
                limit: 1,
                failures: vec![
                    (token("t1"), false),
                    (token("t1"), true),
                    (token("t2"), false),
                    (token("t2"), true),
                ],
            },
            Case {
                name: "addresses are separate, IPv6 by /64, v4-mapped as v4",
                limit: 1,
                failures: vec![
                    (addr("10.0.0.1"), false),
                    (addr("10.0.0.2"), false),
                    (addr("::ffff:10.0.0.1"), true),
                    (addr("2001:db8::1"), false),
                    (addr("2001:db8::2"), true),
                    (addr("2001:db8:0:1::1"), false),
                ],
            },
            Case {
                name: "0 turns it off",
                limit: 0,
                failures: vec![(a(), false), (a(), false), (token("t"), false)],
            },
        ];
        for c in cases {
            let l = AuthLimiter::new(c.limit);
            for (i, (key, over)) in c.failures.iter().enumerate() {
                assert_eq!(l.failed(key), *over, "{}: failure {i} ({key:?})", c.name);
            }
            if c.limit == 0 {
                assert_eq!(l.tracked(), 0, "{}", c.name);
            }
        }
    }

    #[test]
    fn the_window_slides() {
        let l = AuthLimiter::new(2);
        let k = token("t");
        let t0 = Instant::now();
        assert!(!l.failed_at(&k, t0));
        assert!(!l.failed_at(&k, t0));
        assert!(l.failed_at(&k, t0 + Duration::from_secs(59)));
        // Two minutes on, the earlier failures no longer count.
        assert!(!l.failed_at(&k, t0 + Duration::from_secs(180)));

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
    fn memory_is_bounded() {
        let mut l = AuthLimiter::new(1);
        l.max_keys = 3;
        let t0 = Instant::now();
        for i in 0..10 {
            l.failed_at(&addr(&format!("10.0.0.{i}")), t0);
        }
        assert_eq!(l.tracked(), 3);
        // A key tracked already is still counted when the map is full.
        assert!(l.failed_at(&addr("10.0.0.0"), t0));
        // Stale keys make room for new ones.
        let later = t0 + Duration::from_secs(150);
        assert!(!l.failed_at(&addr("10.0.0.9"), later));
        assert!(l.failed_at(&addr("10.0.0.9"), later));
        assert_eq!(l.tracked(), 1);
    }
}
