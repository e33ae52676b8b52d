//! The statement log format: one JSON object per line, one file per token under
//! `<data dir>/logs/<task>/<token id>.jsonl`. A `statement` record is appended before the
//! statement is forwarded, an `outcome` record (same `seq`) after it completed, so a
//! statement that ran is never missing even if the gateway dies mid-statement.

use std::path::{Path, PathBuf};

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
    Io { path: PathBuf, source: std::io::Error },
}

/// Path of a token's log.
pub fn log_path(data_dir: &Path, task: &str, token: &str) -> PathBuf {
    data_dir.join("logs").join(task).join(format!("{token}.jsonl"))
}

/// Read a token's log and pair statements with outcomes, in statement order. Lines that do
/// not parse (a torn last line after a crash) are skipped.
pub fn read_statements(path: &Path) -> Result<Vec<LoggedStatement>, LogError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(LogError::Io { path: path.to_path_buf(), source }),
    };
    let mut out: Vec<LoggedStatement> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for line in text.lines() {
        match serde_json::from_str::<LogRecord>(line) {
            Ok(LogRecord::Statement(s)) => {
                index.insert(s.seq, out.len());
                out.push(LoggedStatement { statement: s, outcome: None });
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
