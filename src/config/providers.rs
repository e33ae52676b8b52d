//! `[template]` and `[remote]` of the configuration: where scratch databases come from
//! when they are not local instances.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{check_sslmode, de_duration, ConfigError};

/// `[template]`: scratch databases on an existing Postgres server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TemplateSection {
    /// DSN of an admin role that may create databases and roles.
    pub admin_dsn: Option<String>,
    /// Name of the golden database.
    pub golden: String,
    /// SQL file the golden is built from; default: `[golden] sql` when set, else the golden
    /// database must exist.
    pub golden_sql: Option<PathBuf>,
    /// Role owning the golden's objects (default: `sandpit_golden_owner` when built from SQL,
    /// else the golden database's owner).
    pub golden_owner: Option<String>,
    /// TLS to the server: "disable", "require", "verify-full"; default: the DSN's sslmode.
    pub sslmode: Option<String>,
    /// CA certificate file to verify the server with.
    pub ca_file: Option<PathBuf>,
    /// Start even when `pg_hba.conf` lets task roles in from elsewhere than the gateway.
    pub trust_network: bool,
}

impl Default for TemplateSection {
    fn default() -> Self {
        TemplateSection {
            admin_dsn: None,
            golden: "sandpit_golden".into(),
            golden_sql: None,
            golden_owner: None,
            sslmode: None,
            ca_file: None,
            trust_network: false,
        }
    }
}

/// `[remote]`: scratch databases from a sandbox service over HTTP (docs/remote-provider.yaml).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteSection {
    /// Base URL of the service API, e.g. `https://sandboxes.internal/`.
    pub url: Option<String>,
    /// Instead of `url`: base URLs of several services (sandpit workers, docs/workers.md);
    /// new forks go round-robin, a token keeps its service. Only append: a token's handle
    /// names its service by position in this list.
    pub urls: Vec<String>,
    /// Bearer key for the service; else `SANDPIT_REMOTE_API_KEY`.
    pub api_key: Option<String>,
    /// The golden sandbox forks are made from.
    pub golden: String,
    /// Value of the `sandpit.owner` metadata on every sandbox this gateway makes.
    pub owner: String,
    /// Time to establish a connection to the service.
    #[serde(deserialize_with = "de_duration")]
    pub connect_timeout: Duration,
    /// Time for one HTTP request.
    #[serde(deserialize_with = "de_duration")]
    pub request_timeout: Duration,
    /// Longest wait for a fork to become ready, retries and polling included.
    #[serde(deserialize_with = "de_duration")]
    pub fork_timeout: Duration,
    /// Retries after a connect error or a 5xx/429 answer (with backoff).
    pub retries: u32,
    /// Added to the token's expiry for the TTL set on the sandbox (the service's backstop).
    #[serde(deserialize_with = "de_duration")]
    pub ttl_grace: Duration,
    /// TLS to the sandboxes: "disable", "require", "verify-full" (the stricter of this and
    /// the service's answer is used).
    pub sslmode: String,
    /// CA certificate file to verify sandboxes with.
    pub ca_file: Option<PathBuf>,
    /// With several `urls`: a worker that answers no capacity question for this long is
    /// lost, and the tokens it held are ended (docs/workers.md); 0 = never.
    #[serde(deserialize_with = "de_duration")]
    pub worker_lost_after: Duration,
}

impl Default for RemoteSection {
    fn default() -> Self {
        RemoteSection {
            url: None,
            urls: Vec::new(),
            api_key: None,
            golden: "sandpit-golden".into(),
            owner: "sandpit".into(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            fork_timeout: Duration::from_secs(120),
            retries: 2,
            ttl_grace: Duration::from_secs(600),
            sslmode: "require".into(),
            ca_file: None,
            worker_lost_after: Duration::from_secs(300),
        }
    }
}

impl TemplateSection {
    /// What `provider = "template"` needs.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.admin_dsn.as_deref().unwrap_or("").is_empty() {
            return Err(ConfigError::Invalid {
                key: "template.admin_dsn",
                message: "provider \"template\" needs the DSN of an admin role".into(),
            });
        }
        if let Some(m) = &self.sslmode {
            check_sslmode("template.sslmode", m)?;
        }
        Ok(())
    }
}

impl RemoteSection {
    /// What `provider = "remote"` needs.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let http = |u: &str| u.starts_with("http://") || u.starts_with("https://");
        let one = self.url.as_deref().filter(|u| http(u)).is_some();
        let many = !self.urls.is_empty() && self.urls.iter().all(|u| http(u));
        if one == many {
            return Err(ConfigError::Invalid {
                key: "remote.url",
                message: "provider \"remote\" needs the service's http(s):// URL \
                          (`url`), or the URLs of workers (`urls`), not both"
                    .into(),
            });
        }
        check_sslmode("remote.sslmode", &self.sslmode)?;
        if self.request_timeout.is_zero() || self.fork_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                key: "remote.request_timeout",
                message: "timeouts must be longer than zero".into(),
            });
        }
        if self.retries > 10 {
            return Err(ConfigError::Invalid {
                key: "remote.retries",
                message: "at most 10".into(),
            });
        }
        Ok(())
    }
}
