//! `[worker]` of the configuration: a node that holds scratch databases for front gateways
//! and serves them the sandbox API of `docs/remote-provider.yaml` (docs/workers.md).

use std::net::SocketAddr;

use serde::Deserialize;

use super::ConfigError;

/// `[worker]`: when `listen` is set, `serve` runs as a worker, not as a gateway.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSection {
    /// Address of the sandbox API (HTTPS unless `tls.mode = "off"`); unset = not a worker.
    pub listen: Option<SocketAddr>,
    /// Bearer key the fronts send (their `remote.api_key`); else `SANDPIT_WORKER_API_KEY`.
    pub api_key: Option<String>,
    /// Name of the golden the fronts ask for (their `remote.golden`).
    pub golden: String,
    /// Host name or address fronts reach scratch servers at; default: the `listen` address.
    pub host: Option<String>,
    /// Most sandboxes held at once; a create past it is refused (503) and reported full in
    /// `GET /v1/capacity`, so fronts place forks elsewhere. Warm-pool members are not counted.
    pub max_sandboxes: u64,
}

impl Default for WorkerSection {
    fn default() -> Self {
        WorkerSection {
            listen: None,
            api_key: None,
            golden: "sandpit-golden".into(),
            host: None,
            max_sandboxes: 64,
        }
    }
}

/// Shortest bearer key a worker accepts.
const MIN_KEY_LEN: usize = 16;

impl WorkerSection {
    /// The bearer key: config, else `SANDPIT_WORKER_API_KEY`; at least 16 characters.
    pub fn key(&self) -> Result<String, ConfigError> {
        let k = self
            .api_key
            .clone()
            .or_else(|| std::env::var("SANDPIT_WORKER_API_KEY").ok())
            .unwrap_or_default();
        if k.len() < MIN_KEY_LEN {
            return Err(ConfigError::Invalid {
                key: "worker.api_key",
                message: format!(
                    "a worker needs a bearer key of at least {MIN_KEY_LEN} characters \
                     (or SANDPIT_WORKER_API_KEY)"
                ),
            });
        }
        Ok(k)
    }

    /// Values types alone do not rule out.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_sandboxes == 0 {
            return Err(ConfigError::Invalid {
                key: "worker.max_sandboxes",
                message: "at least 1".into(),
            });
        }
        Ok(())
    }
}
