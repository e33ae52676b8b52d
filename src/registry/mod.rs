//! The token store. The embedded default keeps one JSON file per token in the data dir,
//! written atomically and fsynced, so a write that returned survives a crash.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::auth::Verifier;

/// Errors of the token store.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry i/o at {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("registry file {path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("token {0} already exists")]
    Exists(String),
}

/// Where a token is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenState {
    /// Issued, no backend yet.
    Issued,
    /// Has (or had) a backend and may connect.
    Live,
    /// TTL passed.
    Expired,
    /// Revoked by the harness.
    Revoked,
}

impl TokenState {
    /// Whether the token may still open sessions.
    pub fn is_usable(self) -> bool {
        matches!(self, TokenState::Issued | TokenState::Live)
    }
}

/// What happens when a result exceeds its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CapMode {
    /// Send the first rows, a notice, and a CommandComplete counting what was sent.
    #[default]
    Truncate,
    /// Fail the statement with SQLSTATE 54000 and send no rows.
    Error,
}

/// Per-token caps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caps {
    /// Rows per statement.
    pub max_rows: u64,
    /// Bytes of row data per statement.
    pub max_bytes: u64,
    /// Concurrent sessions.
    pub max_connections: u32,
    /// Truncate or fail capped results.
    #[serde(default)]
    pub cap_mode: CapMode,
    /// Seatbelt: statement kinds allowed (None = all). Unparsed statements are denied
    /// whenever this is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// `statement_timeout` of each session, ms (0 = none). Also enforced by the gateway.
    #[serde(default)]
    pub statement_timeout_ms: u64,
    /// `idle_in_transaction_session_timeout` of each session, ms (0 = none).
    #[serde(default)]
    pub idle_in_transaction_timeout_ms: u64,
}

/// Everything the gateway knows about one token. The secret itself is never stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public id (also the Postgres user name in the DSN).
    pub id: String,
    /// Task name given at issue.
    pub task: String,
    /// Free-form key/value metadata.
    pub metadata: BTreeMap<String, String>,
    /// When it was issued.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it expires.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// Caps.
    pub caps: Caps,
    /// State.
    pub state: TokenState,
    /// SHA-256 and SCRAM verifier of the secret.
    pub verifier: Verifier,
    /// The provider's handle of its backend, once forked.
    pub backend: Option<String>,
    /// How many times a backend was forked for it (1 at most, unless its backend vanished).
    pub fork_count: u64,
    /// Golden version its backend was copied from (providers with versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
    /// When it was expired or revoked.
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub ended_at: Option<OffsetDateTime>,
}

/// The embedded registry.
pub struct Registry {
    dir: PathBuf,
    tokens: DashMap<String, TokenRecord>,
    // Serialises file writes so an older state can never overwrite a newer one.
    write_lock: Mutex<()>,
}

impl Registry {
    /// Open (or create) the registry under `dir`, loading every token file.
    pub fn open(dir: &Path) -> Result<Registry, RegistryError> {
        let io = |source| RegistryError::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let tokens = DashMap::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue; // temp files from an interrupted write
            }
            let text = std::fs::read(&path).map_err(|source| RegistryError::Io {
                path: path.clone(),
                source,
            })?;
            let rec: TokenRecord =
                serde_json::from_slice(&text).map_err(|e| RegistryError::Corrupt {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            tokens.insert(rec.id.clone(), rec);
        }
        Ok(Registry {
            dir: dir.to_path_buf(),
            tokens,
            write_lock: Mutex::new(()),
        })
    }

    /// Store a new token (on disk before this returns).
    pub fn insert(&self, rec: TokenRecord) -> Result<(), RegistryError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.tokens.contains_key(&rec.id) {
            return Err(RegistryError::Exists(rec.id));
        }
        self.persist(&rec)?;
        self.tokens.insert(rec.id.clone(), rec);
        Ok(())
    }

    /// A copy of one token.
    pub fn get(&self, id: &str) -> Option<TokenRecord> {
        self.tokens.get(id).map(|r| r.clone())
    }

    /// Copies of all tokens, oldest first.
    pub fn list(&self) -> Vec<TokenRecord> {
        let mut v: Vec<_> = self.tokens.iter().map(|r| r.clone()).collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }

    /// Change a token and persist it; returns the new record (None if unknown).
    pub fn update(
        &self,
        id: &str,
        f: impl FnOnce(&mut TokenRecord),
    ) -> Result<Option<TokenRecord>, RegistryError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut rec) = self.get(id) else {
            return Ok(None);
        };
        f(&mut rec);
        self.persist(&rec)?;
        self.tokens.insert(id.to_string(), rec.clone());
        Ok(Some(rec))
    }

    fn persist(&self, rec: &TokenRecord) -> Result<(), RegistryError> {
        let path = self.dir.join(format!("{}.json", rec.id));
        let tmp = self.dir.join(format!("{}.json.tmp", rec.id));
        let io = |source| RegistryError::Io {
            path: path.clone(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(rec).map_err(|e| RegistryError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode_0600()
                .open(&tmp)
                .map_err(io)?;
            f.write_all(&bytes).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, &path).map_err(io)?;
        // The rename is durable only once the directory is synced.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        Ok(())
    }
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}
