//! The sandbox service API the `remote` provider speaks (`docs/remote-provider.yaml`), as
//! Rust types shared by the provider and the test server that implements it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Header that makes a retried create return the sandbox of the first attempt.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Metadata key: the gateway that made the sandbox (config `remote.owner`).
pub const META_OWNER: &str = "sandpit.owner";
/// Metadata key: token id.
pub const META_TOKEN: &str = "sandpit.token";
/// Metadata key: task name.
pub const META_TASK: &str = "sandpit.task";
/// Metadata key: token expiry, RFC 3339.
pub const META_EXPIRES: &str = "sandpit.expires_at";

/// `POST /v1/sandboxes`: fork the golden sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateSandbox {
    /// Name of the golden sandbox to fork.
    pub golden: String,
    /// Free-form labels, returned as given and usable as a list filter.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// `PUT /v1/sandboxes/{id}/ttl`: the service deletes the sandbox this long from now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetTtl {
    /// Seconds from now.
    pub ttl_seconds: u64,
}

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Being forked; poll until ready.
    Creating,
    /// Accepting connections.
    Ready,
    /// The fork failed; `error` says why. Delete it.
    Failed,
}

/// How to reach a ready sandbox with the Postgres protocol.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Connection {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Role to log in as (never a superuser).
    pub user: String,
    /// Its password; absent when the service authenticates otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Database name.
    pub database: String,
    /// What the sandbox offers: "disable", "require" or "verify-full".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslmode: Option<String>,
}

/// A sandbox as the service reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sandbox {
    /// Service-assigned id: `[A-Za-z0-9._-]{1,128}`.
    pub id: String,
    /// Golden it was forked from.
    pub golden: String,
    /// State.
    pub state: SandboxState,
    /// Labels given at creation.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// When the service will delete it (RFC 3339), once a TTL is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Present when `state` is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<Connection>,
    /// Present when `state` is failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Golden version it was copied from, once forked (sandpit workers; optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `GET /v1/sandboxes?label=key=value`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxList {
    /// Matching sandboxes.
    pub sandboxes: Vec<Sandbox>,
}

/// `GET /v1/capacity` (sandpit workers; optional for other services): how much room the
/// service has for new sandboxes. Fronts with several `remote.urls` place forks by it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Capacity {
    /// Most sandboxes held at once (`worker.max_sandboxes`); a create past it answers 503.
    pub max_sandboxes: u64,
    /// Sandboxes held now (being created or ready).
    pub sandboxes: u64,
    /// Warm-pool members ready to be claimed: the fastest forks.
    pub warm: u64,
    /// A draining service makes no new sandboxes; the ones it holds keep serving.
    pub draining: bool,
}

/// `POST /v1/drain`: start or stop draining.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Drain {
    /// true (the default): refuse new sandboxes; false: take them again.
    #[serde(default = "yes")]
    pub draining: bool,
}

fn yes() -> bool {
    true
}

/// Body of every 4xx/5xx answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong, for a person.
    pub error: String,
}

/// Whether `id` is a well-formed sandbox id (safe in a URL path and a log line).
pub fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && id != "."
        && id != ".."
}

/// `POST /v1/goldens` (sandpit workers; optional for other services, which answer 404):
/// build a golden version from a live database. The DSN carries the source's password: it
/// travels only in this body, over the API's TLS, and is never logged.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildGolden {
    /// Version id, chosen by the front so that it names the same content on every worker.
    pub id: String,
    /// DSN of the source database.
    pub from_dsn: String,
    /// Only these schemas (all when empty).
    #[serde(default)]
    pub schemas: Vec<String>,
    /// Tables left out (`pg_dump --exclude-table` patterns).
    #[serde(default)]
    pub exclude_tables: Vec<String>,
    /// Masking rules, the text of a TOML rules file.
    #[serde(default)]
    pub mask: Option<String>,
}

impl std::fmt::Debug for BuildGolden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the DSN: it holds the source's password.
        f.debug_struct("BuildGolden")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// `GET /v1/goldens` (sandpit workers; optional): the worker's golden versions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GoldenList {
    /// Oldest first, the configured SQL file's golden first.
    pub goldens: Vec<crate::provider::golden::store::GoldenInfo>,
}
