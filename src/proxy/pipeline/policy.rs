//! The seatbelt policy: which statement kinds a token may run, and how a refusal is raised
//! inside the backend so the client sees a true transaction state.

use std::collections::VecDeque;

use super::{Pending, Pipeline, Stmt};
use crate::journal::classify::Kind;

/// Raises the refusal inside the backend, so that the transaction state the client sees
/// after a refused statement is the real one.
pub(super) const DENY_SQL: &str =
    "DO $sandpit$ BEGIN RAISE EXCEPTION 'sandpit policy' USING ERRCODE = '42501'; END $sandpit$";

impl Pipeline {
    pub(super) fn denies(&self, kind: Kind) -> bool {
        match &self.id.allow {
            None => false,
            Some(allowed) => kind == Kind::Unparsed || !allowed.iter().any(|k| k == kind.as_str()),
        }
    }

    pub(super) fn denial_message(&self, kind: Kind) -> String {
        let allowed = self.id.allow.as_deref().unwrap_or_default().join(", ");
        format!(
            "sandpit policy: this token may run only {allowed} statements; this one is {} and was not run (the scratch database, not this policy, is the boundary)",
            kind.as_str()
        )
    }

    /// Refuse a whole simple Query or FunctionCall: log it, and send the refusal instead.
    pub(super) fn deny_simple(&mut self, stmts: VecDeque<Stmt>) {
        let mut message = None;
        for mut s in stmts {
            if message.is_none() && self.denies(s.kind) {
                s.denied = true;
                message = Some(self.denial_message(s.kind));
                metrics::counter!("sandpit_denied_statements_total", "kind" => s.kind.as_str())
                    .increment(1);
                self.log_outcome(&s, Some("42501"), None, false);
            } else {
                self.log_outcome(&s, None, None, true);
            }
        }
        let message = message.unwrap_or_else(|| self.denial_message(Kind::Unparsed));
        self.refuse_in_backend("42501", message);
    }

    /// Refuse a simple Query or FunctionCall whose statement record could not be written:
    /// the log's promise is that it is written before anything runs.
    pub(super) fn refuse_unlogged(&mut self, stmts: VecDeque<Stmt>) {
        metrics::counter!("sandpit_unlogged_refusals_total").increment(1);
        for s in stmts {
            self.log_outcome(&s, Some("58030"), None, false);
        }
        self.refuse_in_backend("58030", super::responses::unlogged_message());
    }

    /// Send the backend a query that fails, shown to the client as `code` and `message`.
    fn refuse_in_backend(&mut self, code: &'static str, message: String) {
        let mut q = DENY_SQL.as_bytes().to_vec();
        q.push(0);
        // A Query drops the unnamed statement and portal on the server.
        self.stmt_dirty = true;
        self.portal_dirty = true;
        self.push(
            crate::wire::frame::build(b'Q', &q),
            vec![Pending::Denied { code, message }],
        );
    }
}
