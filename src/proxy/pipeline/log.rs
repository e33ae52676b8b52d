//! Statement log records of a session: a statement record before a message goes to the
//! backend (write-ahead), an outcome record when its response arrives.

use std::time::Instant;

use time::OffsetDateTime;

use super::{Pipeline, Stmt};
use crate::proxy::caps::ResultCount;
use crate::review::classify::{self, Kind};
use crate::review::log::{LogRecord, OutcomeRecord, StatementRecord};
use crate::wire::messages;

/// Longest text parameter kept in the log, in bytes.
const PARAM_LOG_MAX: usize = 256;
/// Binary parameters are logged as a hex prefix of this many bytes.
const PARAM_HEX_MAX: usize = 32;

fn now() -> String {
    OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub(super) fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn verb_of(text: &str) -> &'static str {
    let t = text
        .trim_start()
        .get(..5)
        .unwrap_or("")
        .to_ascii_uppercase();
    if t == "FETCH" {
        "FETCH"
    } else {
        "SELECT"
    }
}

pub(super) fn log_param(fmt: i16, v: Option<&[u8]>) -> Option<String> {
    let v = v?;
    if fmt == 1 {
        let n = v.len().min(PARAM_HEX_MAX);
        let more = if v.len() > n { "…" } else { "" };
        return Some(format!("\\x{}{more}", hex::encode(&v[..n])));
    }
    let mut s = String::from_utf8_lossy(&v[..v.len().min(PARAM_LOG_MAX)]).into_owned();
    if v.len() > PARAM_LOG_MAX {
        s.push('…');
    }
    Some(s)
}

impl Stmt {
    fn new(kind: Kind, verb: &'static str) -> Stmt {
        Stmt {
            seq: 0,
            kind,
            started: Instant::now(),
            count: ResultCount::default(),
            held: Vec::new(),
            beyond: Vec::new(),
            portal_key: None,
            statement_id: None,
            copy_out: false,
            lowered: false,
            verb,
            denied: false,
            results: 0,
            total_rows: 0,
            capped: false,
            last_tag: None,
            copy_ends_before: 0,
            function: false,
            unlogged: false,
        }
    }

    /// Counts a result no logged statement expected (never logged itself).
    pub(super) fn stray() -> Stmt {
        Stmt::new(Kind::Unparsed, "SELECT")
    }
}

impl Pipeline {
    /// Write the statement record; its sequence number, or None when it could not be
    /// written (the statement must then not run).
    pub(super) fn log_statement(
        &self,
        protocol: &str,
        text: &str,
        params: Vec<Option<String>>,
        kind: Kind,
    ) -> Option<u64> {
        metrics::counter!("sandpit_statements_total", "kind" => kind.as_str()).increment(1);
        let Some(log) = &self.id.log else {
            return Some(0);
        };
        let seq = log.next_seq();
        let rec = LogRecord::Statement(StatementRecord {
            seq,
            ts: now(),
            token: self.id.token.clone(),
            task: self.id.task.clone(),
            session: self.id.session,
            protocol: protocol.to_string(),
            text: text.to_string(),
            params,
            kind: kind.as_str().to_string(),
        });
        match log.append(&rec) {
            Ok(()) => Some(seq),
            Err(e) => {
                // Written before it runs, or it does not run.
                tracing::error!(error = %e, "statement log write failed; the statement is refused");
                metrics::counter!("sandpit_log_errors_total").increment(1);
                None
            }
        }
    }

    pub(super) fn new_stmt(&self, protocol: &str, text: &str, params: Vec<Option<String>>) -> Stmt {
        let kind = classify::classify(text);
        let seq = self.log_statement(protocol, text, params, kind);
        let mut s = Stmt::new(kind, verb_of(text));
        s.seq = seq.unwrap_or(0);
        s.unlogged = seq.is_none();
        s.copy_ends_before = self.copy_ends;
        s
    }

    pub(super) fn log_outcome(
        &self,
        stmt: &Stmt,
        sqlstate: Option<String>,
        tag: Option<&str>,
        skipped: bool,
    ) {
        let rows = match tag.and_then(messages::tag_rows) {
            // Rows affected by a write: its tag says how many.
            Some(n) if !stmt.capped && stmt.total_rows == 0 => Some(n),
            _ if skipped || sqlstate.is_some() => None,
            _ => Some(stmt.total_rows),
        };
        if stmt.unlogged {
            // No statement record to attach an outcome to.
            return;
        }
        if stmt.capped {
            metrics::counter!("sandpit_capped_statements_total").increment(1);
        }
        let rec = LogRecord::Outcome(OutcomeRecord {
            seq: stmt.seq,
            ts: now(),
            rows,
            capped: stmt.capped,
            duration_ms: stmt.started.elapsed().as_secs_f64() * 1000.0,
            sqlstate,
            tag: tag.map(str::to_string),
            skipped,
            denied: stmt.denied,
        });
        let Some(log) = &self.id.log else { return };
        if let Err(e) = log.append(&rec) {
            tracing::error!(error = %e, "statement log write failed");
            metrics::counter!("sandpit_log_errors_total").increment(1);
        }
    }
}
