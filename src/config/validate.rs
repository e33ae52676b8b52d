//! What types alone do not rule out: a loaded configuration's values checked against each
//! other and against what the gateway can work with, each error naming its key.

use std::time::Duration;

use super::{check_admin_key, Config, ConfigError};

impl Config {
    /// Highest `max_connections` a token may be issued with: `tokens.max_connections_limit`,
    /// or for `instance` what each scratch server admits for the agent's role
    /// (`postgres.max_connections` less its 3 superuser-reserved slots and 2 for the
    /// gateway's own connections), so a token cannot be promised sessions its server would
    /// refuse with 53300 (a pool that churns connections met that: asyncpg's test suite).
    pub fn max_connections_limit(&self) -> Option<u32> {
        self.tokens.max_connections_limit.or_else(|| {
            (self.provider == "instance").then(|| self.postgres.max_connections.saturating_sub(5))
        })
    }

    /// Check values that types alone do not rule out.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_listeners()?;
        if let Some(k) = &self.admin_key {
            check_admin_key("admin_key", k)?;
        }
        self.promote.validate()?;
        self.pool.validate()?;
        self.worker.validate()?;
        match self.provider.as_str() {
            "instance" => {}
            "microvm" => self.microvm.validate()?,
            "template" => self.template.validate()?,
            "remote" => self.remote.validate()?,
            other => {
                return Err(ConfigError::Invalid {
                    key: "provider",
                    message: format!(
                        "unknown provider {other:?} (available: \"instance\", \"template\", \"remote\", \"microvm\")"
                    ),
                })
            }
        }
        match self.tls.mode.as_str() {
            "off" | "auto" => {}
            "files" => {
                if self.tls.cert.is_none() || self.tls.key.is_none() {
                    return Err(ConfigError::Invalid {
                        key: "tls.mode",
                        message: "\"files\" needs tls.cert and tls.key".into(),
                    });
                }
            }
            other => {
                return Err(ConfigError::Invalid {
                    key: "tls.mode",
                    message: format!("{other:?} is not one of off, auto, files"),
                })
            }
        }
        self.check_bounds()?;
        if let Some(url) = &self.registry.url {
            self.validate_shared_registry(url)?;
        }
        self.validate_shared_dir()?;
        if self.tokens.ttl > self.tokens.max_ttl {
            return Err(ConfigError::Invalid {
                key: "tokens.ttl",
                message: "is longer than tokens.max_ttl".into(),
            });
        }
        Ok(())
    }

    /// Numbers and sizes within what the gateway can work with.
    fn check_bounds(&self) -> Result<(), ConfigError> {
        if self.tokens.max_rows == 0 {
            return Err(ConfigError::Invalid {
                key: "tokens.max_rows",
                message: "must be at least 1".into(),
            });
        }
        if self.tokens.max_connections == 0 {
            return Err(ConfigError::Invalid {
                key: "tokens.max_connections",
                message: "must be at least 1".into(),
            });
        }
        if let Some(limit) = self.max_connections_limit() {
            if self.tokens.max_connections > limit {
                return Err(ConfigError::Invalid {
                    key: "tokens.max_connections",
                    message: format!(
                        "is more than a token may have ({limit}: tokens.max_connections_limit, or for the instance provider postgres.max_connections - 5)"
                    ),
                });
            }
        }
        if self.limits.max_startup_packet < 8 {
            return Err(ConfigError::Invalid {
                key: "limits.max_startup_packet",
                message: "must be at least 8".into(),
            });
        }
        if self.limits.max_message < 1024 {
            return Err(ConfigError::Invalid {
                key: "limits.max_message",
                message: "must be at least 1024".into(),
            });
        }
        if self.shutdown_grace > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid {
                key: "shutdown_grace",
                message: "must be at most 1h".into(),
            });
        }
        if self.relay_threads > 1024 {
            return Err(ConfigError::Invalid {
                key: "relay_threads",
                message: "must be at most 1024 (0: sessions run on the main pool)".into(),
            });
        }
        if self.databases.is_empty() || self.databases.iter().any(|d| d.is_empty()) {
            return Err(ConfigError::Invalid {
                key: "databases",
                message: "must name at least one database, none empty (\"*\": any)".into(),
            });
        }
        if !self.janitor.interval.is_zero() && self.janitor.interval < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                key: "janitor.interval",
                message: "must be at least 1s (or \"0s\" to run only at start)".into(),
            });
        }
        let tfl = &self.postgres.temp_file_limit;
        let unit = tfl.trim_start_matches(|c: char| c.is_ascii_digit() || c == '-');
        if tfl.is_empty()
            || !matches!(unit, "" | "kB" | "MB" | "GB" | "TB")
            || unit.len() == tfl.len()
        {
            return Err(ConfigError::Invalid {
                key: "postgres.temp_file_limit",
                message: format!("{tfl:?} is not a size like \"1GB\", \"500MB\" or \"-1\""),
            });
        }
        Ok(())
    }
}
