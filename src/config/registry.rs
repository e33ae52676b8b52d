//! `[registry]` of the configuration, and its checks.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::journal::log::LogPlace;

use super::{check_sslmode, de_duration, Config, ConfigError};

/// `[registry]`: the token store. Unset `url` = files in the data dir (one gateway);
/// a `postgresql://` URL = tables in that database, shared by every replica using it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistrySection {
    /// `postgresql://user:password@host:port/database` of the shared registry.
    pub url: Option<String>,
    /// TLS to the registry server: "disable", "require", "verify-full"; default: the URL's.
    pub sslmode: Option<String>,
    /// CA certificate file to verify the registry server with.
    pub ca_file: Option<PathBuf>,
    /// Full re-read of the shared registry, the fallback to LISTEN/NOTIFY.
    #[serde(deserialize_with = "de_duration")]
    pub refresh_interval: Duration,
    /// A directory every front mounts (on Kubernetes a ReadWriteMany volume): statement
    /// logs (a file per front and token, read as one log) and stored reviews and decisions
    /// go there instead of the data dir, so any front reads and reviews any token.
    pub shared_dir: Option<PathBuf>,
    /// How long a front's sessions count towards a token's `max_connections` on the other
    /// fronts after the front was last heard of (renewed every third of it).
    #[serde(deserialize_with = "de_duration")]
    pub session_lease: Duration,
    /// Registry connections this gateway runs queries on at once (locks and the change
    /// listener take their own); more queries wait for one.
    pub max_connections: usize,
    /// The longest a query waits for a registry connection before failing (the API answers
    /// 503, a login is refused).
    #[serde(deserialize_with = "de_duration")]
    pub acquire_timeout: Duration,
}

impl Default for RegistrySection {
    fn default() -> Self {
        RegistrySection {
            url: None,
            sslmode: None,
            ca_file: None,
            refresh_interval: Duration::from_secs(5),
            shared_dir: None,
            session_lease: Duration::from_secs(30),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// Where statement logs are written and read: `registry.shared_dir` when set, else the
    /// data dir.
    pub fn log_place(&self) -> LogPlace {
        match &self.registry.shared_dir {
            Some(d) => LogPlace::Shared(d.clone()),
            None => LogPlace::Local(self.data_dir.clone()),
        }
    }

    /// `registry.shared_dir` needs a shared registry (it names the tokens whose logs it
    /// holds) and an absolute path (every front resolves it alike).
    pub(super) fn validate_shared_dir(&self) -> Result<(), ConfigError> {
        let Some(dir) = &self.registry.shared_dir else {
            return Ok(());
        };
        if self.registry.url.is_none() {
            return Err(ConfigError::Invalid {
                key: "registry.shared_dir",
                message: "needs registry.url: fronts share their logs and reviews only when they share a registry".into(),
            });
        }
        if !dir.is_absolute() {
            return Err(ConfigError::Invalid {
                key: "registry.shared_dir",
                message: "must be an absolute path".into(),
            });
        }
        Ok(())
    }

    /// A shared registry needs backends every replica can reach, and no per-replica pool.
    pub(super) fn validate_shared_registry(&self, url: &str) -> Result<(), ConfigError> {
        if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
            return Err(ConfigError::Invalid {
                key: "registry.url",
                message: "must be a postgresql:// URL (leave it unset for the file registry)"
                    .into(),
            });
        }
        if let Some(m) = &self.registry.sslmode {
            check_sslmode("registry.sslmode", m)?;
        }
        if self.provider == "instance" {
            return Err(ConfigError::Invalid {
                key: "registry.url",
                message: "a shared registry needs provider \"template\" or \"remote\": \
                          \"instance\" backends listen on unix sockets in one machine's data dir, \
                          which other replicas cannot reach"
                    .into(),
            });
        }
        if self.pool.enabled() {
            return Err(ConfigError::Invalid {
                key: "pool.size",
                message: "the warm pool is per gateway and not supported with a shared registry; set it (and pool.max_size) to 0".into(),
            });
        }
        if self.registry.max_connections == 0 {
            return Err(ConfigError::Invalid {
                key: "registry.max_connections",
                message: "must be at least 1".into(),
            });
        }
        if self.registry.acquire_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                key: "registry.acquire_timeout",
                message: "must be more than 0".into(),
            });
        }
        if self.registry.session_lease < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                key: "registry.session_lease",
                message: "must be at least 1s".into(),
            });
        }
        if self.registry.refresh_interval < Duration::from_millis(100) {
            return Err(ConfigError::Invalid {
                key: "registry.refresh_interval",
                message: "must be at least 100ms".into(),
            });
        }
        Ok(())
    }
}
