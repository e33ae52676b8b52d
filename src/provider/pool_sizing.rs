//! How big the warm pool should be right now: its standing size, grown toward a ceiling
//! while recent first connections outrun it, and back to the standing size when they stop.
//! Pure arithmetic over explicit instants, so the decision is tested without I/O.

use std::time::{Duration, Instant};

/// The pool's sizing settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSizing {
    /// Members kept ready when nothing is happening.
    pub size: usize,
    /// The most members the pool grows to under demand (at least `size`).
    pub max_size: usize,
    /// Time for the weight of one first connection in the demand to halve.
    pub half_life: Duration,
    /// Forks at once while members are wanted now; 0 = [`auto_parallel`] of the cores.
    pub parallel_forks: usize,
}

impl PoolSizing {
    /// Forks the filler may run at once while members are wanted now.
    pub fn parallel(&self, cores: usize) -> usize {
        if self.parallel_forks > 0 {
            self.parallel_forks
        } else {
            auto_parallel(cores)
        }
    }
}

/// Twice the cores, at least 4: a fork waits on the disk and on its server's start as much
/// as it computes (on one core, 4 at once brought a burst of 100 first connections' p99
/// from 4.3 s to 1.9 s against 1 at once, docs/BENCHMARKS.md).
pub fn auto_parallel(cores: usize) -> usize {
    (2 * cores).max(4)
}

impl PoolSizing {
    /// Members the pool should hold at `demand` (see [`Demand`]): the standing size, or
    /// the demand rounded up when it is higher, never above the ceiling.
    pub fn target(&self, demand: f64) -> usize {
        let ceiling = self.max_size.max(self.size);
        if !demand.is_finite() || demand <= self.size as f64 {
            return self.size;
        }
        // `demand` is above `size` here, so the cast is of a positive, bounded number.
        (demand.ceil().min(ceiling as f64) as usize).max(self.size)
    }
}

/// Recent first connections as an exponentially decaying count: each adds 1, and the sum
/// halves every `half_life`. After a burst of N it reads about N, then decays back to 0.
#[derive(Debug, Clone, Copy)]
pub struct Demand {
    value: f64,
    at: Instant,
}

impl Demand {
    /// No recent first connections, as of `now`.
    pub fn new(now: Instant) -> Demand {
        Demand {
            value: 0.0,
            at: now,
        }
    }

    /// The decayed count at `now` (an earlier `now` than the last event reads as that event).
    pub fn value(&self, now: Instant, half_life: Duration) -> f64 {
        let elapsed = now.saturating_duration_since(self.at);
        if half_life.is_zero() {
            return 0.0;
        }
        self.value * 0.5f64.powf(elapsed.as_secs_f64() / half_life.as_secs_f64())
    }

    /// One first connection at `now`.
    pub fn record(&mut self, now: Instant, half_life: Duration) {
        self.value = self.value(now, half_life) + 1.0;
        self.at = self.at.max(now);
    }
}

/// What the filler does next, given the ready members, those being forked and the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Fork one more member.
    Fork,
    /// Destroy one idle member (the pool is above its target).
    Shrink,
    /// Nothing until the next claim, or until the demand has decayed (when above `size`).
    Wait,
}

/// The filler's next step: fork while below the target, shrink while above it.
pub fn next_step(ready: usize, filling: usize, target: usize) -> Step {
    if ready + filling < target {
        Step::Fork
    } else if ready > target {
        Step::Shrink
    } else {
        Step::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(10);

    fn sizing(size: usize, max_size: usize) -> PoolSizing {
        PoolSizing {
            size,
            max_size,
            half_life: H,
            parallel_forks: 0,
        }
    }

    #[test]
    fn target_follows_demand_within_size_and_ceiling() {
        // (size, max_size, demand, target)
        let table = [
            (2, 2, 50.0, 2),    // no ceiling above size: never grows
            (2, 10, 0.0, 2),    // idle: the standing size
            (2, 10, 2.0, 2),    // demand met by the standing size
            (2, 10, 2.1, 3),    // rounded up
            (2, 10, 7.0, 7),    // grows with demand
            (2, 10, 400.0, 10), // never above the ceiling
            (0, 5, 0.5, 1),     // a pool of 0 grows under demand when it has a ceiling
            (0, 0, 9.0, 0),     // no pool at all
            (4, 1, 9.0, 4),     // a ceiling below size counts as size
            (2, 10, f64::NAN, 2),
            (2, 10, f64::INFINITY, 2),
        ];
        for (size, max, demand, want) in table {
            assert_eq!(
                sizing(size, max).target(demand),
                want,
                "size {size} max {max} demand {demand}"
            );
        }
    }

    #[test]
    fn parallel_forks_are_the_setting_or_twice_the_cores_at_least_four() {
        // (parallel_forks, cores, parallel)
        for (setting, cores, want) in [
            (0, 1, 4),
            (0, 2, 4),
            (0, 3, 6),
            (0, 16, 32),
            (1, 16, 1),
            (7, 2, 7),
        ] {
            let mut s = sizing(2, 2);
            s.parallel_forks = setting;
            assert_eq!(s.parallel(cores), want, "setting {setting} cores {cores}");
        }
    }

    #[test]
    fn demand_adds_one_per_first_connection_and_halves_each_half_life() {
        let t0 = Instant::now();
        let mut d = Demand::new(t0);
        assert_eq!(d.value(t0, H), 0.0);
        for _ in 0..8 {
            d.record(t0, H);
        }
        assert_eq!(d.value(t0, H), 8.0);
        assert!((d.value(t0 + H, H) - 4.0).abs() < 1e-9);
        assert!((d.value(t0 + 3 * H, H) - 1.0).abs() < 1e-9);
        d.record(t0 + H, H);
        assert!((d.value(t0 + H, H) - 5.0).abs() < 1e-9);
        // An instant before the last event reads as that event, not as growth.
        assert!((d.value(t0, H) - 5.0).abs() < 1e-9);
        assert_eq!(d.value(t0 + H, Duration::ZERO), 0.0);
    }

    #[test]
    fn a_burst_grows_the_target_then_it_decays_back_to_size() {
        let s = sizing(2, 8);
        let t0 = Instant::now();
        let mut d = Demand::new(t0);
        for _ in 0..20 {
            d.record(t0, H);
        }
        assert_eq!(s.target(d.value(t0, H)), 8);
        assert_eq!(s.target(d.value(t0 + 2 * H, H)), 5); // 20 / 4
        assert_eq!(s.target(d.value(t0 + 4 * H, H)), 2); // 1.25: the standing size
    }

    #[test]
    fn next_step_forks_below_the_target_and_shrinks_above_it() {
        // (ready, filling, target, step)
        let table = [
            (0, 0, 2, Step::Fork),
            (1, 1, 2, Step::Wait), // the one being forked makes two
            (2, 0, 2, Step::Wait),
            (3, 0, 2, Step::Shrink),
            (3, 1, 2, Step::Shrink),
            (2, 1, 2, Step::Wait), // one in flight is offered, then shrunk if still too many
            (0, 0, 0, Step::Wait),
        ];
        for (ready, filling, target, want) in table {
            assert_eq!(
                next_step(ready, filling, target),
                want,
                "ready {ready} filling {filling} target {target}"
            );
        }
    }
}
