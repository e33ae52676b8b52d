//! The backend side of the pipeline: each response is matched against the FIFO of what the
//! client's messages will cause, so results can be capped, outcomes logged, and the client
//! still sees a correct sequence of tags and transaction states.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

use super::*;
use crate::proxy::caps::CapMode;
use crate::wire::messages::{self, Severity};
use crate::wire::scrub;

/// How a result ended for the client. A tag is borrowed from the backend's completion
/// when the client sees that one (no copy per result).
enum Closed<'t> {
    /// With this tag (None: the backend's own completion, no tag).
    Shown(Option<Cow<'t, str>>),
    /// With this tag, the one a simple Query's statement keeps as its `last_tag`.
    Last(Option<Cow<'t, str>>),
    /// The gateway makes the backend raise 54000 in its place (error mode).
    Injected,
}

impl Pipeline {
    /// The statement whose results are arriving now; a result nobody expected (the gateway
    /// misread the client's stream) is counted as a stray, never passed on uncounted.
    /// A stray result in progress keeps its count until it ends, even if a statement
    /// reaches the front of the FIFO meanwhile (a result is delimited by the stream).
    fn counting(&mut self) -> &mut Stmt {
        let Pipeline { fifo, stray, .. } = self;
        let front = match fifo.front_mut() {
            Some(Pending::Execute { stmt, .. }) => Some(&mut **stmt),
            Some(Pending::Simple { stmts }) => stmts.front_mut(),
            _ => None,
        };
        if stray.is_none() {
            if let Some(s) = front {
                return s;
            }
        }
        stray.get_or_insert_with(Stmt::stray)
    }

    /// A message from the backend: append what the client must see to `out`.
    pub fn on_backend(&mut self, f: Frame, out: &mut BytesMut, secrets: &[String]) {
        match f.tag {
            b'1' | b'2' | b'3' => {
                let swallow = match self.fifo.pop_front() {
                    Some(Pending::Parse { swallow, change })
                    | Some(Pending::Bind { swallow, change })
                    | Some(Pending::Close { swallow, change }) => {
                        self.settle(change, true);
                        swallow
                    }
                    Some(other) => {
                        self.fifo.push_front(other);
                        false
                    }
                    None => false,
                };
                if !swallow {
                    out.extend_from_slice(&f.raw);
                }
            }
            b'n' | b'T' => {
                if let Some(Pending::Describe { .. }) = self.fifo.front() {
                    if let Some(Pending::Describe {
                        swallow_nodata,
                        portal_key,
                        statement,
                    }) = self.fifo.pop_front()
                    {
                        if f.tag == b'T' {
                            let catalog = messages::reads_only_catalogs(f.body());
                            self.described(portal_key, catalog);
                            if let Some((name, id)) = statement {
                                self.statement_described(&name, id, catalog);
                            }
                        }
                        if !(swallow_nodata && f.tag == b'n') {
                            out.extend_from_slice(&f.raw);
                        }
                    }
                } else {
                    if f.tag == b'T' {
                        // A simple query's result starts: its columns decide the row cap.
                        let catalog = messages::reads_only_catalogs(f.body());
                        let s = self.counting();
                        s.count.catalog = catalog;
                        s.described = true;
                    }
                    out.extend_from_slice(&f.raw);
                }
            }
            b'D' => self.on_row(f, out),
            b'H' => {
                self.counting().copy_out = true;
                out.extend_from_slice(&f.raw);
            }
            b'G' => {
                self.on_copy_in();
                out.extend_from_slice(&f.raw);
            }
            b'd' => {
                let policy = self.id.caps;
                let s = self.counting();
                // COPY TO is drained, not stopped: cancelling would abort the transaction.
                if s.count.admit_copy(&policy, f.raw.len()) {
                    out.extend_from_slice(&f.raw);
                }
            }
            b'C' | b'I' | b'V' => self.on_complete(f, out),
            b's' => self.on_suspended(f, out),
            b'E' => self.on_error(f, out, secrets),
            b'Z' => self.on_ready(f, out),
            b'N' => {
                let shown = self.shown_error(&f, secrets);
                self.relay_noise(Noise::Notice, &shown, out);
            }
            b'A' => self.relay_noise(Noise::Notification, &f.raw, out),
            _ => out.extend_from_slice(&f.raw),
        }
        if !self.held.is_empty() {
            self.release_held();
        }
    }

    /// A notice or notification: relayed while this stretch's budget lasts, else dropped
    /// (and counted for the summary notice at the next ReadyForQuery).
    fn relay_noise(&mut self, noise: Noise, raw: &[u8], out: &mut BytesMut) {
        if self.chatter.admit(noise, raw.len(), self.id.caps.max_bytes) {
            out.extend_from_slice(raw);
        } else if self.chatter.dropped() == 1 {
            metrics::counter!("sandpit_capped_notices_total").increment(1);
        }
    }

    /// A portal's RowDescription: if the Execute right behind it runs that very portal (no
    /// Bind in between), its result is a catalog read or not by these columns.
    fn described(&mut self, portal_key: Option<(Vec<u8>, u64)>, catalog: bool) {
        let Some(key) = portal_key else { return };
        if let Some(Pending::Execute { stmt, .. }) = self.fifo.front_mut() {
            if stmt.portal_key.as_ref() == Some(&key) {
                stmt.count.catalog = catalog;
                stmt.described = true;
            }
        }
    }

    /// A prepared statement's RowDescription: later portals bound from it, and Executes of
    /// such portals already queued right behind (a driver's Parse/Describe/Bind/Execute in
    /// one batch), are catalog results or not by these columns.
    fn statement_described(&mut self, name: &[u8], id: u64, catalog: bool) {
        if let Some(p) = self.prepared.settled_mut(name) {
            if p.id == id {
                p.catalog = catalog;
            }
        }
        for p in self.fifo.first_mut(4) {
            if let Pending::Execute { stmt, .. } = p {
                if stmt.statement_id == Some(id) {
                    stmt.count.catalog = catalog;
                    stmt.described = true;
                }
            }
        }
    }

    fn on_ready(&mut self, f: Frame, out: &mut BytesMut) {
        self.tx_status = f.body().first().copied().unwrap_or(b'I');
        self.stray = None;
        match self.fifo.pop_front() {
            Some(Pending::Simple { mut stmts }) => {
                for s in stmts.drain(..) {
                    // The last statement of a Query may have had results (it stays until
                    // ReadyForQuery so that every result is counted).
                    let done = s.results > 0;
                    self.log_outcome(&s, None, s.last_tag.as_deref(), !done);
                }
                self.recycle_stmts(stmts);
            }
            Some(Pending::Sync { .. }) | Some(Pending::Denied { .. }) | None => {}
            Some(other) => {
                // Out of step (should not happen): keep the entry, relay anyway.
                let _in = self.span.enter();
                tracing::warn!("ReadyForQuery while waiting for another response");
                self.fifo.push_front(other);
            }
        }
        if let Some(summary) = self.chatter.end(self.id.caps.max_bytes) {
            out.extend_from_slice(&summary);
        }
        if let Some(warning) = self.log_fill_warning() {
            out.extend_from_slice(&warning);
        }
        if self.tx_status == b'I' {
            // Protocol-level portals end with their transaction.
            let spare = &mut self.spare_params;
            self.portals.clear_confirmed(|old| keep_params(spare, old));
        }
        out.extend_from_slice(&f.raw);
    }

    /// CopyInResponse: until the client's next CopyDone/CopyFail the server ignores Sync
    /// (and Flush), so Syncs the client sent in that stretch will get no ReadyForQuery.
    fn on_copy_in(&mut self) {
        let before = self.counting().copy_ends_before;
        // It cannot be capped, and it needs the client's data to reach its result.
        self.fifo.lift_front_barrier();
        let ignored = |p: &Pending| matches!(p, Pending::Sync { copy_ends_before } if *copy_ends_before == before);
        let dropped = self.fifo.drop_syncs(ignored) + self.outbox.drop_responses(ignored);
        self.ignored_syncs += dropped as u64;
        if self.copy_ends == before {
            // The client has not ended it yet: its Syncs until then are ignored too.
            self.copy_in_until = Some(before);
        }
    }

    fn on_row(&mut self, f: Frame, out: &mut BytesMut) {
        let policy = self.id.caps;
        let s = self.counting();
        let past_row_cap = !s.count.catalog && s.count.rows >= policy.max_rows;
        if past_row_cap && !s.lowered && policy.mode == CapMode::Truncate && !s.count.truncated {
            // The backend runs this one to its end: if it is a write, these are RETURNING
            // rows the client is owed (its tag decides). Held within the byte cap.
            let len = f.raw.len() as u64;
            if s.count.bytes + len <= policy.max_bytes {
                s.count.bytes += len;
                s.beyond.push(f.raw);
            } else {
                s.count.truncated = true;
                s.count.by_bytes = true;
            }
            return;
        }
        if s.count.admit(&policy, f.raw.len()) {
            if policy.mode == CapMode::Error && s.lowered {
                s.held.push(f.raw);
            } else {
                out.extend_from_slice(&f.raw);
            }
        } else if policy.mode == CapMode::Error {
            s.held.clear();
        }
    }

    /// CommandComplete, EmptyQueryResponse or FunctionCallResponse.
    fn on_complete(&mut self, f: Frame, out: &mut BytesMut) {
        let tag = if f.tag == b'C' {
            messages::command_tag(f.body())
        } else {
            None
        };
        if self.stray.is_some() {
            // It ends the stray result in progress, not whatever reached the FIFO's front.
            return self.close_stray(&f, tag, out);
        }
        match self.fifo.pop_front() {
            Some(Pending::Execute { mut stmt, .. }) => {
                self.finish(&mut stmt, Some(&f), tag, out);
                self.recycle(stmt);
            }
            Some(Pending::Simple { mut stmts }) => {
                if stmts.len() > 1 {
                    if let Some(mut stmt) = stmts.pop_front() {
                        self.finish(&mut stmt, Some(&f), tag, out);
                    }
                } else if let Some(stmt) = stmts.front_mut() {
                    // Its outcome is logged at ReadyForQuery: more results may follow when
                    // the text held more statements than the splitter saw.
                    if let Closed::Last(shown) = self.close_result(stmt, Some(&f), tag, out) {
                        keep_tag(&mut stmt.last_tag, shown);
                    }
                }
                self.fifo.push_front(Pending::Simple { stmts });
            }
            Some(other) => {
                self.fifo.push_front(other);
                self.close_stray(&f, tag, out);
            }
            None => self.close_stray(&f, tag, out),
        }
    }

    /// A result that no statement expected: capped like any other, then forgotten.
    fn close_stray(&mut self, f: &Frame, tag: Option<&str>, out: &mut BytesMut) {
        match self.stray.take() {
            Some(mut s) => {
                metrics::counter!("sandpit_stray_results_total").increment(1);
                self.close_result(&mut s, Some(f), tag, out);
            }
            None => out.extend_from_slice(&f.raw),
        }
    }

    fn on_suspended(&mut self, f: Frame, out: &mut BytesMut) {
        if self.stray.take().is_some() {
            // It ends the stray result in progress.
            out.extend_from_slice(&f.raw);
            return;
        }
        match self.fifo.pop_front() {
            Some(Pending::Execute { mut stmt, .. }) if stmt.lowered => {
                self.finish(&mut stmt, None, None, out);
                self.recycle(stmt);
            }
            Some(Pending::Execute { stmt, .. }) => {
                // The client's own max_rows: a cursor-style fetch, passed on as is.
                self.log_outcome(&stmt, None, Some("(portal suspended)"), false);
                out.extend_from_slice(&f.raw);
                self.recycle(stmt);
            }
            Some(other) => {
                self.fifo.push_front(other);
                self.stray = None;
                out.extend_from_slice(&f.raw);
            }
            None => {
                self.stray = None;
                out.extend_from_slice(&f.raw);
            }
        }
    }

    /// A statement's result ended (with its completion message, or None when the portal
    /// was suspended by our lowered max_rows): pass it on and log the outcome.
    fn finish(
        &mut self,
        stmt: &mut Stmt,
        completion: Option<&Frame>,
        tag: Option<&str>,
        out: &mut BytesMut,
    ) {
        match self.close_result(stmt, completion, tag, out) {
            Closed::Shown(shown) | Closed::Last(shown) => {
                self.log_outcome(stmt, None, shown.as_deref(), false)
            }
            Closed::Injected => self.log_outcome(stmt, Some("54000"), None, false),
        }
    }

    /// One result of `stmt` ended: what the client sees for it, with its counts added to
    /// the statement's totals and the counters reset for a next result.
    fn close_result<'t>(
        &mut self,
        stmt: &mut Stmt,
        completion: Option<&Frame>,
        tag: Option<&'t str>,
        out: &mut BytesMut,
    ) -> Closed<'t> {
        let policy = self.id.caps;
        let mut count = std::mem::take(&mut stmt.count);
        let held = std::mem::take(&mut stmt.held);
        let beyond = std::mem::take(&mut stmt.beyond);
        let copy_out = std::mem::replace(&mut stmt.copy_out, false);
        let rows_seen = count.rows > 0 || count.truncated || !beyond.is_empty() || !held.is_empty();
        stmt.note_tag(tag, rows_seen, copy_out);
        if !beyond.is_empty() {
            if tag.is_some_and(is_write_tag) {
                // A write's RETURNING rows: all of them (within the byte cap) are owed.
                count.rows += beyond.len() as u64;
                out.extend_from_slice(&beyond.concat());
            } else {
                count.truncated = true;
            }
        }
        stmt.results += 1;
        stmt.total_rows += match (&tag, copy_out, count.truncated) {
            // COPY: the tag counts rows; its data messages are not rows (binary COPY has a
            // trailer message).
            (Some(t), true, false) => messages::tag_rows(t).unwrap_or(count.rows),
            _ => count.rows,
        };
        stmt.capped |= count.truncated;
        let function_result = completion.is_some_and(|c| c.tag == b'V');
        if function_result {
            // A FunctionCallResponse is one value: a row of its own, capped by bytes.
            stmt.total_rows += 1;
        }
        if function_result && !count.truncated {
            let len = completion.map_or(0, |c| c.raw.len());
            let mut one = ResultCount::default();
            if !one.admit(&policy, len) {
                stmt.capped = true;
                stmt.total_rows -= 1;
                metrics::counter!("sandpit_capped_statements_total").increment(1);
                if policy.mode == CapMode::Error {
                    out.extend_from_slice(&messages::error_response(
                        Severity::Error,
                        "54000",
                        &policy.error_text(),
                    ));
                } else {
                    out.extend_from_slice(&policy.notice(0, true, true));
                    out.extend_from_slice(&messages::function_result_null());
                }
                return Closed::Shown(Some(Cow::Borrowed("(function result cut)")));
            }
        }
        if !count.truncated {
            for r in held {
                out.extend_from_slice(&r);
            }
            let shown = match completion {
                Some(c) => {
                    out.extend_from_slice(&c.raw);
                    tag.map(Cow::Borrowed)
                }
                // Suspended exactly at cap + 1 can only mean truncated; be safe anyway.
                None => {
                    let t = format!("{} {}", stmt.verb, count.rows);
                    messages::put_command_complete(out, &t);
                    Some(Cow::Owned(t))
                }
            };
            return Closed::Last(shown);
        }
        if policy.mode == CapMode::Error && stmt.lowered {
            // Make the backend itself fail here, so the transaction state and the skipping of
            // the rest of the pipeline are real, then show the client a clean 54000.
            let sql = "DO $sandpit$ BEGIN RAISE EXCEPTION 'sandpit cap' USING ERRCODE = '54000'; END $sandpit$";
            self.stmt_dirty = true;
            self.portal_dirty = true;
            self.outbox
                .unnamed_run_first(sql.as_bytes(), Pending::InjectedError);
            return Closed::Injected;
        }
        // Not lowered: the server ran the statement to its end, the gateway dropped the rest.
        out.extend_from_slice(&policy.notice(count.rows, count.by_bytes, !stmt.lowered));
        let shown = match (tag, stmt.lowered, copy_out) {
            // Rows were drained: the backend's tag (rows affected) is the truth.
            (Some(t), false, false) if messages::tag_rows(t).is_some() && !is_read_tag(t) => {
                Cow::Borrowed(t)
            }
            (_, _, true) => Cow::Owned(format!("COPY {}", count.rows)),
            _ => Cow::Owned(format!("{} {}", stmt.verb, count.rows)),
        };
        messages::put_command_complete(out, &shown);
        Closed::Last(Some(shown))
    }

    /// An error or notice as the client is shown it: the gateway's secrets out, every field
    /// bounded, the client's own statement and portal names in place of the gateway's.
    fn shown_error(&self, f: &Frame, secrets: &[String]) -> Bytes {
        // Names first: the scrub then bounds every field, the replaced names included.
        let named = self.with_client_names(&f.raw);
        let msg = named.as_deref().unwrap_or(&f.raw);
        scrub::scrub_error(msg[0], msg.get(5..).unwrap_or(&[]), secrets)
            .or(named)
            .unwrap_or_else(|| f.raw.clone())
    }

    fn on_error(&mut self, f: Frame, out: &mut BytesMut, secrets: &[String]) {
        let code = messages::error_code(f.body());
        let scrubbed = self.shown_error(&f, secrets);
        self.stray = None;
        match self.fifo.front_mut() {
            Some(Pending::Denied { code, message }) => {
                out.extend_from_slice(&messages::error_response(Severity::Error, code, message));
            }
            Some(Pending::Simple { stmts }) => {
                // The rest of a simple query is skipped by the server; ReadyForQuery follows.
                let failed = stmts.pop_front();
                let skipped: Vec<Stmt> = stmts.drain(..).collect();
                if let Some(s) = failed {
                    self.log_outcome(&s, code.as_deref(), None, false);
                }
                for s in skipped {
                    self.log_outcome(&s, None, None, true);
                }
                out.extend_from_slice(&scrubbed);
            }
            Some(_) => self.on_extended_error(code, scrubbed, out),
            None => out.extend_from_slice(&scrubbed),
        }
    }

    /// Extended protocol: the server skips everything up to the next Sync.
    fn on_extended_error(&mut self, code: Option<String>, scrubbed: Bytes, out: &mut BytesMut) {
        let mut first = true;
        let mut injected = false;
        let mut refusal: Option<(&'static str, String)> = None;
        // Only the entry at the front failed; a refusal behind it was merely skipped.
        let refused = matches!(self.fifo.front(), Some(Pending::Refused));
        while let Some(p) = self.fifo.front() {
            if matches!(p, Pending::Sync { .. }) {
                break;
            }
            match self.fifo.pop_front() {
                Some(Pending::Execute { stmt, .. }) => {
                    if first && stmt.denied {
                        refusal = Some(("42501", self.denial_message(stmt.kind)));
                        self.log_outcome(&stmt, Some("42501"), None, false);
                    } else if first && stmt.unlogged {
                        refusal = Some(("58030", unlogged_message()));
                        self.log_outcome(&stmt, Some("58030"), None, false);
                    } else if first {
                        self.log_outcome(&stmt, code.as_deref(), None, false);
                    } else {
                        self.log_outcome(&stmt, None, None, true);
                    }
                    first = false;
                }
                Some(Pending::InjectedError) => injected = true,
                Some(other) => self.skipped(other),
                None => {}
            }
        }
        // Messages not yet sent up to the next Sync are skipped by the server too: they
        // are still sent, but nothing is expected from them.
        if self.fifo.is_empty() {
            self.skip_until_sync = true;
        }
        if let Some((code, msg)) = refusal {
            out.extend_from_slice(&messages::error_response(Severity::Error, code, &msg));
        } else if refused {
            let msg = format!(
                "sandpit: this session already holds {MAX_TRACKED} named prepared statements \
                 or portals, or {} MiB of their text; close some (protocol Close) before \
                 making more",
                MAX_TRACKED_BYTES >> 20
            );
            out.extend_from_slice(&messages::error_response(Severity::Error, "53400", &msg));
        } else if injected {
            let msg = self.id.caps.error_text();
            out.extend_from_slice(&messages::error_response(Severity::Error, "54000", &msg));
        } else {
            out.extend_from_slice(&scrubbed);
        }
    }
}

/// Keeps `shown` as a statement's last tag, in the string it holds already when there is
/// one (no allocation per result).
fn keep_tag(slot: &mut Option<String>, shown: Option<Cow<'_, str>>) {
    match (slot.as_mut(), shown) {
        (Some(s), Some(t)) => {
            s.clear();
            s.push_str(&t);
        }
        (_, shown) => *slot = shown.map(Cow::into_owned),
    }
}

/// Tags of writes, whose RETURNING rows are never cut by the row cap.
fn is_write_tag(tag: &str) -> bool {
    ["INSERT", "UPDATE", "DELETE", "MERGE"]
        .iter()
        .any(|w| tag.starts_with(w))
}

/// Tags whose count is rows returned, not rows written (a cut result shows what was sent).
fn is_read_tag(tag: &str) -> bool {
    tag.starts_with("SELECT") || tag.starts_with("FETCH") || tag.starts_with("MOVE")
}

/// What the client is told when a statement record could not be written.
pub(super) fn unlogged_message() -> String {
    "sandpit: the statement log could not be written, so the statement was not run (the log is written before anything runs); the operator has been alerted".to_string()
}
