//! Configuration: a TOML file, `SANDPIT_*` environment variables and command-line flags
//! (flags win). Unknown keys and bad values are errors that name the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A configuration problem, with the key it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Postgres wire listener.
    pub listen: SocketAddr,
    /// HTTP control API listener.
    pub api_listen: SocketAddr,
    /// Where tokens, logs, keys and (by default) Postgres data live.
    pub data_dir: PathBuf,
    /// Host name put into DSNs; default: the listen address.
    pub public_host: Option<String>,
    /// Admin bearer key for the control API; else `SANDPIT_ADMIN_KEY`, else `<data_dir>/admin.key`.
    pub admin_key: Option<String>,
    /// Which provider makes scratch databases: "instance", "template", "remote" or "microvm".
    pub provider: String,
    /// The `template` provider (a Postgres server of yours).
    pub template: TemplateSection,
    /// The `remote` provider (a sandbox service over HTTP).
    pub remote: RemoteSection,
    /// The `microvm` provider (a QEMU VM per task).
    pub microvm: MicrovmSection,
    /// TLS on the Postgres listener.
    pub tls: TlsConfig,
    /// Local PostgreSQL server settings (instance provider).
    pub postgres: PostgresConfig,
    /// Golden snapshot.
    pub golden: GoldenConfig,
    /// Protocol limits.
    pub limits: LimitsConfig,
    /// Defaults and ceilings for tokens.
    pub tokens: TokenDefaults,
    /// On SIGTERM/SIGINT, how long open sessions may go on (new ones are refused) before they
    /// are ended with 57P01.
    #[serde(deserialize_with = "de_duration")]
    pub shutdown_grace: Duration,
    /// Threads that relay sessions, each running its own sessions start to end; 0 (the
    /// default): sessions run on the main pool, with work stealing. Fewer instructions per
    /// transaction, but a flooding session can stall the others dealt to its thread.
    pub relay_threads: usize,
    /// Database names a client may ask for in its startup packet (every token's database
    /// answers to each); `"*"` (the default): any name, so a stack's DSN that names its own
    /// database works unchanged. With names, any other is refused with 3D000, as a server
    /// refuses a database it does not have; the user name (libpq's default when none is
    /// given) is always accepted.
    pub databases: Vec<String>,
    /// The janitor that reaps backends without a valid token.
    pub janitor: JanitorConfig,
    /// The statement log.
    pub log: LogConfig,
    /// Warm pool of ready forks.
    pub pool: PoolConfig,
    /// Review diffs against the golden.
    pub review: ReviewConfig,
    /// Where tokens are kept: the data dir (default) or a Postgres database replicas share.
    pub registry: RegistrySection,
    /// Review decisions, validators and promotion of approved changes.
    pub promote: PromoteSection,
    /// Worker mode: serve scratch databases to front gateways (docs/workers.md).
    pub worker: WorkerSection,
}

/// Janitor settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JanitorConfig {
    /// Time between passes (one always runs at start); "0s" turns the schedule off.
    #[serde(deserialize_with = "de_duration")]
    pub interval: Duration,
}

impl Default for JanitorConfig {
    fn default() -> Self {
        JanitorConfig {
            interval: Duration::from_secs(30),
        }
    }
}

/// Statement log settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Write every statement to `<data_dir>/logs/<task>/<token>.jsonl` before it runs.
    pub statements: bool,
    /// Bytes of statement log per token (0 = no limit): a statement whose record would
    /// pass it is refused (SQLSTATE 58030), so no statement runs unlogged.
    pub max_bytes_per_token: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            statements: true,
            max_bytes_per_token: crate::journal::log::DEFAULT_MAX_BYTES_PER_TOKEN,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 6432)),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 6433)),
            data_dir: PathBuf::from("./.sandpit"),
            public_host: None,
            admin_key: None,
            provider: "instance".into(),
            template: TemplateSection::default(),
            remote: RemoteSection::default(),
            microvm: MicrovmSection::default(),
            tls: TlsConfig::default(),
            postgres: PostgresConfig::default(),
            golden: GoldenConfig::default(),
            limits: LimitsConfig::default(),
            tokens: TokenDefaults::default(),
            shutdown_grace: Duration::from_secs(10),
            relay_threads: 0,
            databases: vec!["*".into()],
            janitor: JanitorConfig::default(),
            log: LogConfig::default(),
            pool: PoolConfig::default(),
            review: ReviewConfig::default(),
            registry: RegistrySection::default(),
            promote: PromoteSection::default(),
            worker: WorkerSection::default(),
        }
    }
}

/// TLS for clients.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// "off" (answer `N` to SSLRequest), "auto" (self-signed certificate generated into the
    /// data dir on first start) or "files" (`cert` and `key`).
    pub mode: String,
    /// PEM certificate chain, for mode "files".
    pub cert: Option<PathBuf>,
    /// PEM private key, for mode "files".
    pub key: Option<PathBuf>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            mode: "auto".into(),
            cert: None,
            key: None,
        }
    }
}

/// Local Postgres server settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// Directory with `postgres`, `initdb`, `psql`; default: `pg_config --bindir`, then the newest `/usr/lib/postgresql/*/bin`.
    pub bin_dir: Option<PathBuf>,
    /// OS user Postgres runs as when the gateway runs as root.
    pub run_as: Option<String>,
    /// Start each scratch server in an empty network namespace when possible.
    pub netns: bool,
    /// `max_connections` of each scratch server.
    pub max_connections: u32,
    /// Stop a backend (keeping its data) after this long without a session; 0 turns it off.
    #[serde(deserialize_with = "de_duration")]
    pub idle_suspend: Duration,
    /// `temp_file_limit` of each scratch server (superuser-only: the agent cannot raise it),
    /// e.g. "1GB"; "-1" = none.
    pub temp_file_limit: String,
    /// `max_prepared_transactions` of each scratch server: two-phase commit for the task
    /// (each slot costs a few hundred bytes of shared memory per allowed connection); 0 = off.
    pub max_prepared_transactions: u32,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            bin_dir: None,
            run_as: None,
            netns: true,
            max_connections: 30,
            idle_suspend: Duration::from_secs(300),
            temp_file_limit: "1GB".into(),
            max_prepared_transactions: 10,
        }
    }
}

/// Golden snapshot settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GoldenConfig {
    /// SQL file the golden is built from; default: the shipped demo shop.
    pub sql: Option<PathBuf>,
}

/// Protocol limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Time a client has from connect to authenticated.
    #[serde(deserialize_with = "de_duration")]
    pub startup_timeout: Duration,
    /// Largest startup packet accepted.
    pub max_startup_packet: u32,
    /// Largest regular message accepted from a client or backend.
    pub max_message: usize,
    /// Allow cleartext password auth from loopback / unix clients without TLS.
    pub cleartext_on_loopback: bool,
    /// Failed logins per token id (wrong secret) and per source address (unknown id) in a
    /// sliding minute; past it failures are answered late (28000). 0 = no limit.
    pub auth_failures_per_minute: u32,
    /// A fork is refused (before copying anything) while the data dir's filesystem has less
    /// than this many bytes free; 0 turns the check off.
    pub min_free_bytes: u64,
    /// New sessions per second per token once its burst is spent (each starts a backend
    /// process on the shared cores); a session over the pace waits its turn, up to
    /// `startup_timeout`, then is refused with 53300. 0 = no pace.
    pub sessions_per_second: u32,
    /// New sessions a token may open at once before the pace applies.
    pub session_burst: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            startup_timeout: Duration::from_secs(10),
            max_startup_packet: 10 * 1024,
            max_message: 64 * 1024 * 1024,
            cleartext_on_loopback: true,
            auth_failures_per_minute: 20,
            min_free_bytes: 256 * 1024 * 1024,
            sessions_per_second: 50,
            session_burst: 50,
        }
    }
}

/// Defaults and ceilings for tokens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenDefaults {
    /// TTL when the issuer gives none.
    #[serde(deserialize_with = "de_duration")]
    pub ttl: Duration,
    /// Longest TTL that may be asked for.
    #[serde(deserialize_with = "de_duration")]
    pub max_ttl: Duration,
    /// Rows per statement.
    pub max_rows: u64,
    /// Bytes of row data per statement.
    pub max_bytes: u64,
    /// Concurrent sessions per token.
    pub max_connections: u32,
    /// Highest max_connections a token may be issued with; unset: for the `instance`
    /// provider, the sessions a scratch server admits for a non-superuser
    /// ([`Config::max_connections_limit`]), for the others none.
    pub max_connections_limit: Option<u32>,
    /// Highest max_rows a token may be issued with.
    pub max_rows_limit: u64,
    /// Highest max_bytes a token may be issued with.
    pub max_bytes_limit: u64,
    /// `statement_timeout` of each session ("0s" = none).
    #[serde(deserialize_with = "de_duration")]
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout` of each session ("0s" = none).
    #[serde(deserialize_with = "de_duration")]
    pub idle_in_transaction_timeout: Duration,
}

impl Default for TokenDefaults {
    fn default() -> Self {
        TokenDefaults {
            ttl: Duration::from_secs(15 * 60),
            max_ttl: Duration::from_secs(24 * 3600),
            max_rows: 200,
            max_bytes: 1024 * 1024,
            max_connections: 10,
            max_connections_limit: None,
            max_rows_limit: 100_000,
            max_bytes_limit: 64 * 1024 * 1024,
            statement_timeout: Duration::from_secs(5 * 60),
            idle_in_transaction_timeout: Duration::from_secs(10 * 60),
        }
    }
}

/// Review diffs (scratch database against the golden).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReviewConfig {
    /// Write the review to `<dir>/<task>/<token>.{json,txt,sql,html}` before a token's
    /// backend is destroyed at revoke or expiry.
    pub on_end: bool,
    /// Where stored reviews go; default `<data_dir>/reviews`.
    pub dir: Option<PathBuf>,
    /// statement_timeout of each review query.
    #[serde(deserialize_with = "de_duration")]
    pub statement_timeout: Duration,
    /// How long to wait for the agent's sessions to publish their table counters before
    /// scanning every table instead of only the touched ones.
    #[serde(deserialize_with = "de_duration")]
    pub settle_timeout: Duration,
    /// Sample rows kept per table and change kind (counts are always exact).
    pub samples: usize,
    /// At the end of a token, replay the review's patch on a fresh fork of the golden and
    /// record whether it rebuilds the scratch database (providers whose forks are cheap).
    pub verify_on_end: bool,
    /// Bytes reserved on disk for each token's end-of-token review when it is issued (a
    /// quarter per stored format; the review is written into them): a full disk at the
    /// end of a token does not stop the review being stored. 0 reserves nothing.
    pub reserve_bytes: u64,
}

impl Default for ReviewConfig {
    fn default() -> Self {
        ReviewConfig {
            on_end: true,
            dir: None,
            statement_timeout: Duration::from_secs(60),
            settle_timeout: Duration::from_secs(3),
            samples: 20,
            verify_on_end: true,
            reserve_bytes: 1 << 20,
        }
    }
}

pub(crate) fn check_sslmode(key: &'static str, v: &str) -> Result<(), ConfigError> {
    if crate::pgconn::tls::SslMode::parse(v).is_none() {
        return Err(ConfigError::Invalid {
            key,
            message: format!("{v:?} is not one of disable, require, verify-full"),
        });
    }
    Ok(())
}

/// A duration the way the config writes them (`24h`, `90m`, `30s`, `1h 30m`): hours at most,
/// never days, so a message quotes a limit as the operator wrote it.
pub fn display_duration(d: Duration) -> String {
    let mut s = d.as_secs();
    let ms = d.subsec_millis();
    let mut parts = Vec::new();
    for (unit, len) in [("h", 3600), ("m", 60), ("s", 1)] {
        if s >= len {
            parts.push(format!("{}{unit}", s / len));
            s %= len;
        }
    }
    if ms > 0 || parts.is_empty() {
        parts.push(format!("{ms}ms"));
    }
    parts.join(" ")
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("bad duration {s:?}: {e}")))
}

impl Config {
    /// Load from a TOML file (or defaults when `path` is None), then validate.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let cfg = match path {
            None => Config::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.into(),
                    source,
                })?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: p.into(),
                    message: e.to_string(),
                })?
            }
        };
        Ok(cfg)
    }

    /// Overrides from `SANDPIT_*` environment variables for keys that have no command-line
    /// flag (`SANDPIT_LISTEN`, `SANDPIT_API_LISTEN`, `SANDPIT_DATA_DIR` and `SANDPIT_CONFIG`
    /// are flags' variables). `get` is `std::env::var` in the binary.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let dur = |key: &'static str, v: String| {
            humantime::parse_duration(v.trim()).map_err(|e| ConfigError::Invalid {
                key,
                message: format!("bad duration {v:?}: {e}"),
            })
        };
        if let Some(v) = get("SANDPIT_PUBLIC_HOST").filter(|v| !v.is_empty()) {
            self.public_host = Some(v);
        }
        if let Some(v) = get("SANDPIT_GOLDEN_SQL").filter(|v| !v.is_empty()) {
            self.golden.sql = Some(PathBuf::from(v));
        }
        if let Some(v) = get("SANDPIT_TLS_MODE").filter(|v| !v.is_empty()) {
            self.tls.mode = v;
        }
        if let Some(v) = get("SANDPIT_POSTGRES_BIN_DIR").filter(|v| !v.is_empty()) {
            self.postgres.bin_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = get("SANDPIT_SHUTDOWN_GRACE") {
            self.shutdown_grace = dur("SANDPIT_SHUTDOWN_GRACE", v)?;
        }
        if let Some(v) = get("SANDPIT_JANITOR_INTERVAL") {
            self.janitor.interval = dur("SANDPIT_JANITOR_INTERVAL", v)?;
        }
        if let Some(v) = get("SANDPIT_TOKEN_TTL") {
            self.tokens.ttl = dur("SANDPIT_TOKEN_TTL", v)?;
        }
        Ok(())
    }

    /// Host for DSNs.
    pub fn dsn_host(&self) -> String {
        match &self.public_host {
            Some(h) => h.clone(),
            None if self.listen.ip().is_unspecified() => "127.0.0.1".into(),
            None => self.listen.ip().to_string(),
        }
    }
}

mod validate;

mod preflight;
pub use preflight::{check_admin_key, MIN_ADMIN_KEY_BYTES};

mod registry;
pub use registry::RegistrySection;

mod promote;
pub use promote::{PromoteSection, PromoteTarget, ValidatorSection};

mod providers;
pub use providers::{RemoteSection, TemplateSection};

mod pool;
pub use pool::PoolConfig;

mod microvm;
pub use microvm::MicrovmSection;

mod worker;
pub use worker::WorkerSection;

#[cfg(test)]
mod tests;
