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
    /// Which provider makes scratch databases. Only "instance" so far.
    pub provider: String,
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
    /// The statement log.
    pub log: LogConfig,
}

/// Statement log settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Write every statement to `<data_dir>/logs/<task>/<token>.jsonl` before it runs.
    pub statements: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { statements: true }
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
            tls: TlsConfig::default(),
            postgres: PostgresConfig::default(),
            golden: GoldenConfig::default(),
            limits: LimitsConfig::default(),
            tokens: TokenDefaults::default(),
            log: LogConfig::default(),
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
    /// `temp_file_limit` of each scratch server (superuser-only: the agent cannot raise it),
    /// e.g. "1GB"; "-1" = none.
    pub temp_file_limit: String,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            bin_dir: None,
            run_as: None,
            netns: true,
            max_connections: 30,
            temp_file_limit: "1GB".into(),
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
    /// Failed authentications allowed per source address and per token id in a sliding
    /// minute; past it a connection is refused (28000) without checking. 0 = no limit.
    pub auth_failures_per_minute: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            startup_timeout: Duration::from_secs(10),
            max_startup_packet: 10 * 1024,
            max_message: 64 * 1024 * 1024,
            cleartext_on_loopback: true,
            auth_failures_per_minute: 20,
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
            max_rows_limit: 100_000,
            max_bytes_limit: 64 * 1024 * 1024,
            statement_timeout: Duration::from_secs(5 * 60),
            idle_in_transaction_timeout: Duration::from_secs(10 * 60),
        }
    }
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

    /// Check values that types alone do not rule out.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.provider != "instance" {
            return Err(ConfigError::Invalid {
                key: "provider",
                message: format!(
                    "unknown provider {:?} (available: \"instance\")",
                    self.provider
                ),
            });
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
        if self.tokens.ttl > self.tokens.max_ttl {
            return Err(ConfigError::Invalid {
                key: "tokens.ttl",
                message: "is longer than tokens.max_ttl".into(),
            });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = toml::from_str::<Config>("lisen = \"1.2.3.4:5\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lisen"), "{e}");
        let e = toml::from_str::<Config>("[tokens]\nttl = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ttl") || e.contains("soon"), "{e}");
        let c: Config = toml::from_str("provider = \"cloud\"").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("provider"));
        let c: Config = toml::from_str("[tokens]\nttl = \"5m\"\nmax_rows = 10").unwrap();
        assert_eq!(c.tokens.ttl, Duration::from_secs(300));
        c.validate().unwrap();
    }

    #[test]
    fn shipped_example_config_parses_and_matches_defaults() {
        let c: Config = toml::from_str(include_str!("../config/sandpit.toml")).unwrap();
        c.validate().unwrap();
        let d = Config::default();
        assert_eq!(c.listen, d.listen);
        assert_eq!(c.tokens.max_rows, d.tokens.max_rows);
        assert_eq!(c.limits.max_message, d.limits.max_message);
        assert_eq!(c.tls.mode, d.tls.mode);
    }
}
