//! The statement log format: one JSON object per line, one file per token under
//! `<data dir>/logs/<task>/<token id>.jsonl`. A `statement` record is appended before the
//! statement is forwarded, an `outcome` record (same `seq`) after it completed, so a
//! statement that ran is never missing even if the gateway dies mid-statement.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use serde::{Deserialize, Serialize};

/// One line of the log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum LogRecord {
    /// Written before the statement reaches the backend.
    Statement(StatementRecord),
    /// Written when its result is known.
    Outcome(OutcomeRecord),
}

/// A statement as the client sent it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatementRecord {
    /// Sequence number within the token's log (unique per token).
    pub seq: u64,
    /// RFC 3339 time it was received.
    pub ts: String,
    /// Token id.
    pub token: String,
    /// Task name.
    pub task: String,
    /// Session number within the gateway process.
    pub session: u64,
    /// "simple", "extended" or "function".
    pub protocol: String,
    /// Statement text exactly as sent (lossy UTF-8 only if the client's bytes were not UTF-8).
    pub text: String,
    /// Bind parameters: text values capped in length, binary as `\x` + hex prefix, NULL as null.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<Option<String>>,
    /// read / write / ddl / transaction / privilege / utility / unparsed.
    pub kind: String,
}

/// How a statement ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutcomeRecord {
    /// The `seq` of its statement record.
    pub seq: u64,
    /// RFC 3339 time it completed.
    pub ts: String,
    /// Rows returned (SELECT, FETCH, RETURNING, COPY TO) or affected (INSERT/UPDATE/DELETE).
    pub rows: Option<u64>,
    /// Whether the result was cut by a cap.
    pub capped: bool,
    /// Wall time in milliseconds from forwarding to completion.
    pub duration_ms: f64,
    /// SQLSTATE when it failed.
    pub sqlstate: Option<String>,
    /// The command tag the client saw, when it succeeded.
    pub tag: Option<String>,
    /// Never ran: an earlier statement of the same query or pipeline failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// Refused by the token's seatbelt policy; it never reached the backend.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
}

/// A statement with its outcome (None if it never completed, e.g. the session died).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoggedStatement {
    /// The statement.
    #[serde(flatten)]
    pub statement: StatementRecord,
    /// Its outcome.
    pub outcome: Option<OutcomeRecord>,
}

/// Errors reading a log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("statement log {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// An open, append-only log of one token. Each record is one `write(2)` of one line on an
/// O_APPEND file, done before the statement is forwarded: once `append` returns, the record
/// survives a SIGKILL of the gateway (it is in the kernel). `sync` makes it survive a
/// machine crash; the log book runs it every second and when the token ends.
pub struct TokenLog {
    path: PathBuf,
    file: Mutex<std::fs::File>,
    seq: AtomicU64,
    dirty: AtomicBool,
}

impl TokenLog {
    /// Open (create) the log of a token, continuing its sequence numbers.
    pub fn open(data_dir: &Path, task: &str, token: &str) -> Result<TokenLog, LogError> {
        let path = log_path(data_dir, task, token);
        let io = |source| LogError::Io {
            path: path.clone(),
            source,
        };
        crate::datadir::private_dirs(&data_dir.join("logs"), Path::new(task)).map_err(io)?;
        let last = read_statements(&path)?
            .last()
            .map(|s| s.statement.seq)
            .unwrap_or(0);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        Ok(TokenLog {
            path,
            file: Mutex::new(file),
            seq: AtomicU64::new(last),
            dirty: AtomicBool::new(false),
        })
    }

    /// The next statement sequence number.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Append one record as one line.
    pub fn append(&self, rec: &LogRecord) -> Result<(), LogError> {
        // Sized for a typical record up front: growing from empty reallocates several times.
        let mut line = Vec::with_capacity(384);
        serde_json::to_writer(&mut line, rec).map_err(|e| LogError::Io {
            path: self.path.clone(),
            source: e.into(),
        })?;
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&line).map_err(|source| LogError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// fsync if anything was written since the last sync.
    pub fn sync(&self) -> Result<(), LogError> {
        if self.dirty.swap(false, Ordering::AcqRel) {
            let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
            f.sync_data().map_err(|source| LogError::Io {
                path: self.path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The open logs of this process, one per token.
#[derive(Default)]
pub struct LogBook {
    logs: DashMap<String, Arc<TokenLog>>,
}

impl LogBook {
    /// The log of a token, opened on first use.
    pub fn get(&self, data_dir: &Path, task: &str, token: &str) -> Result<Arc<TokenLog>, LogError> {
        if let Some(l) = self.logs.get(token) {
            return Ok(l.clone());
        }
        let log = Arc::new(TokenLog::open(data_dir, task, token)?);
        Ok(self.logs.entry(token.to_string()).or_insert(log).clone())
    }

    /// fsync every log with unsynced records.
    pub fn sync_all(&self) {
        for l in self.logs.iter() {
            if let Err(e) = l.sync() {
                tracing::warn!(error = %e, "statement log sync failed");
            }
        }
    }

    /// Sync and forget a token's log (token ended).
    pub fn close(&self, token: &str) {
        if let Some((_, l)) = self.logs.remove(token) {
            if let Err(e) = l.sync() {
                tracing::warn!(error = %e, "statement log sync failed");
            }
        }
    }
}

/// Path of a token's log.
pub fn log_path(data_dir: &Path, task: &str, token: &str) -> PathBuf {
    data_dir
        .join("logs")
        .join(task)
        .join(format!("{token}.jsonl"))
}

/// Read a token's log and pair statements with outcomes, in statement order. Lines that do
/// not parse (a torn last line after a crash) are skipped.
pub fn read_statements(path: &Path) -> Result<Vec<LoggedStatement>, LogError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(LogError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut out: Vec<LoggedStatement> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for line in text.lines() {
        match serde_json::from_str::<LogRecord>(line) {
            Ok(LogRecord::Statement(s)) => {
                index.insert(s.seq, out.len());
                out.push(LoggedStatement {
                    statement: s,
                    outcome: None,
                });
            }
            Ok(LogRecord::Outcome(o)) => {
                if let Some(&i) = index.get(&o.seq) {
                    out[i].outcome = Some(o);
                }
            }
            Err(_) => continue,
        }
    }
    Ok(out)
}
