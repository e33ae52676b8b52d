//! `[pool]` of the configuration: the warm pool of ready forks, and how far it grows under
//! a burst of first connections.

use std::time::Duration;

use serde::Deserialize;

use super::{de_duration, ConfigError};

/// Warm pool settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Forks kept ready for new tokens (0 = no pool: each first connection forks).
    pub size: usize,
    /// Ceiling the pool grows to while recent first connections outnumber `size`
    /// (0 or at most `size`: it never grows).
    pub max_size: usize,
    /// Time for one first connection's weight in the pool's demand to halve; the pool
    /// shrinks back to `size` as the demand decays.
    #[serde(deserialize_with = "de_duration")]
    pub demand_half_life: Duration,
    /// Forks the pool runs at once while members are wanted now (first connections wait,
    /// or it grows under demand); 0 = twice the cores the gateway may use, at least 4.
    pub parallel_forks: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 0,
            max_size: 0,
            demand_half_life: Duration::from_secs(60),
            parallel_forks: 0,
        }
    }
}

impl PoolConfig {
    /// Whether a pool runs at all (a standing size, or room to grow under demand).
    pub fn enabled(&self) -> bool {
        self.size > 0 || self.max_size > 0
    }

    /// Check what types alone do not rule out.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_size > self.size && self.demand_half_life < Duration::from_secs(1) {
            // The demand would decay before the pool could grow toward it.
            return Err(ConfigError::Invalid {
                key: "pool.demand_half_life",
                message: "must be at least 1s when pool.max_size is above pool.size".into(),
            });
        }
        Ok(())
    }
}
