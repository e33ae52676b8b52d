//! Statement log records of a session: a statement record before a message goes to the
//! backend (write-ahead), an outcome record when its response arrives, deferred to the
//! write of the next statement record (or to the log's idle ticker, or the session's end),
//! so a statement costs one `write(2)`.

use std::sync::OnceLock;
use std::time::Instant;

use bytes::Bytes;
use metrics::Counter;

use super::{Pipeline, Stmt};
use crate::journal::classify::{self, Kind};
use crate::journal::log::{OutcomeRef, StatementRef};
use crate::journal::tag_kind;
use crate::proxy::caps::ResultCount;
use crate::wire::messages;

const KINDS: [Kind; 7] = [
    Kind::Read,
    Kind::Write,
    Kind::Ddl,
    Kind::Transaction,
    Kind::Privilege,
    Kind::Utility,
    Kind::Unparsed,
];

/// `sandpit_statements_total` per kind, looked up once (a labelled lookup per statement
/// hashes and allocates its key).
fn statements_counter(kind: Kind) -> &'static Counter {
    static COUNTERS: OnceLock<Vec<Counter>> = OnceLock::new();
    let all = COUNTERS.get_or_init(|| {
        KINDS
            .iter()
            .map(|k| metrics::counter!("sandpit_statements_total", "kind" => k.as_str()))
            .collect()
    });
    let i = KINDS
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(KINDS.len() - 1);
    &all[i]
}

/// The text of a message, borrowed when it is valid UTF-8 (the common case: no copy).
pub(super) fn text_of(b: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(b) {
        Ok(t) => std::borrow::Cow::Borrowed(t),
        Err(_) => String::from_utf8_lossy(b),
    }
}

fn verb_of(text: &str) -> &'static str {
    let fetch = text
        .trim_start()
        .as_bytes()
        .get(..5)
        .is_some_and(|w| w.eq_ignore_ascii_case(b"FETCH"));
    if fetch {
        "FETCH"
    } else {
        "SELECT"
    }
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
            told: None,
            untold: false,
            described: false,
        }
    }

    /// A result ended with `tag` (None: an empty query or a function's value).
    pub(super) fn note_tag(&mut self, tag: Option<&str>, rows_seen: bool, copy_out: bool) {
        let rows_seen = rows_seen || std::mem::take(&mut self.described);
        match tag.and_then(|t| tag_kind::kind_of_tag(t, rows_seen, copy_out)) {
            Some(k) => self.told = Some(self.told.map_or(k, |t| tag_kind::stronger(t, k))),
            None => self.untold = true,
        }
    }

    /// The kind the server's answers told, for a statement that completed.
    fn server_kind(&self, completed: bool) -> Option<Kind> {
        self.told.filter(|_| completed && !self.untold)
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
        params: &[Option<String>],
        kind: Kind,
    ) -> Option<u64> {
        statements_counter(kind).increment(1);
        let Some(log) = &self.id.log else {
            return Some(0);
        };
        let rec = StatementRef {
            seq: 0, // taken under the log's lock, in write order
            ts: None,
            token: &self.id.token,
            task: &self.id.task,
            session: self.id.session,
            protocol,
            text,
            params,
            kind: kind.as_str(),
        };
        match log.append_next_statement(rec) {
            Ok(seq) => {
                // The write carried this session's deferred outcomes too.
                self.deferred.set(false);
                Some(seq)
            }
            Err(e) => {
                // Written before it runs, or it does not run.
                let _in = self.span.enter();
                tracing::error!(error = %e, "statement log write failed; the statement is refused");
                metrics::counter!("sandpit_log_errors_total").increment(1);
                None
            }
        }
    }

    /// A WARNING for the client when the token's statement log reached a fill level this
    /// session has not told yet (one atomic load per ReadyForQuery otherwise).
    pub(super) fn log_fill_warning(&mut self) -> Option<Bytes> {
        let log = self.id.log.as_ref()?;
        let level = log.fill_warning();
        if level <= self.log_warned {
            return None;
        }
        self.log_warned = level;
        Some(messages::notice_response(
            "WARNING",
            "01000",
            &format!(
                "sandpit: this token's statement log is {level}% full (log.max_bytes_per_token = {} bytes); once it is full every statement is refused with 58030 until the token ends",
                log.max_bytes()
            ),
        ))
    }

    pub(super) fn new_stmt(&self, protocol: &str, text: &str, params: &[Option<String>]) -> Stmt {
        self.new_stmt_as(protocol, text, params, classify::classify(text))
    }

    /// [`Pipeline::new_stmt`] of a text whose kind is known already.
    pub(super) fn new_stmt_as(
        &self,
        protocol: &str,
        text: &str,
        params: &[Option<String>],
        kind: Kind,
    ) -> Stmt {
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
        sqlstate: Option<&str>,
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
        let Some(log) = &self.id.log else { return };
        let rec = OutcomeRef {
            seq: stmt.seq,
            ts: None,
            rows,
            capped: stmt.capped,
            micros: stmt.started.elapsed().as_micros() as u64,
            sqlstate,
            tag,
            skipped,
            denied: stmt.denied,
            kind: stmt
                .server_kind(!skipped && sqlstate.is_none())
                .map(Kind::as_str),
        };
        // Kept for a later write even when a write of earlier ones just failed.
        self.deferred.set(true);
        match log.defer_outcome(&rec) {
            Ok(()) => {}
            Err(e) => {
                let _in = self.span.enter();
                tracing::error!(error = %e, "statement log write failed");
                metrics::counter!("sandpit_log_errors_total").increment(1);
            }
        }
    }

    /// Write the deferred outcome records now (the session ends).
    pub fn flush_outcomes(&self) {
        if !self.deferred.replace(false) {
            return;
        }
        if let Some(log) = &self.id.log {
            if let Err(e) = log.flush_outcomes() {
                let _in = self.span.enter();
                tracing::error!(error = %e, "statement log write failed");
                metrics::counter!("sandpit_log_errors_total").increment(1);
            }
        }
    }
}

impl Drop for Pipeline {
    /// Whatever way the session ends, its deferred outcomes are written.
    fn drop(&mut self) {
        self.flush_outcomes();
    }
}
