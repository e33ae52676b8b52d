//! The backend side of the pipeline: each response is matched against the FIFO of what the
//! client's messages will cause, so results can be capped, outcomes logged, and the client
//! still sees a correct sequence of tags and transaction states.

use bytes::{Bytes, BytesMut};

use super::*;

impl Pipeline {
    /// The statement whose results are arriving now.
    fn current(&mut self) -> Option<&mut Stmt> {
        match self.fifo.front_mut() {
            Some(Pending::Execute { stmt, .. }) => Some(stmt),
            Some(Pending::Simple { stmts }) => stmts.front_mut(),
            _ => None,
        }
    }

    /// A message from the backend: append what the client must see to `out`.
    pub fn on_backend(&mut self, f: Frame, out: &mut BytesMut, secrets: &[String]) {
        match f.tag {
            b'1' | b'2' | b'3' => {
                let swallow = match self.fifo.pop_front() {
                    Some(Pending::Parse { swallow })
                    | Some(Pending::Bind { swallow })
                    | Some(Pending::Close { swallow }) => swallow,
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
                if let Some(Pending::Describe { swallow_nodata }) = self.fifo.front() {
                    let swallow = *swallow_nodata && f.tag == b'n';
                    self.fifo.pop_front();
                    if !swallow {
                        out.extend_from_slice(&f.raw);
                    }
                } else {
                    out.extend_from_slice(&f.raw);
                }
            }
            b'D' => self.on_row(f, out),
            b'H' => {
                if let Some(s) = self.current() {
                    s.copy_out = true;
                }
                out.extend_from_slice(&f.raw);
            }
            b'd' => {
                let policy = self.id.caps;
                match self.current() {
                    Some(s) if s.copy_out => {
                        // COPY TO is drained, not stopped: cancelling would abort the transaction.
                        if s.count.admit_copy(&policy, f.raw.len()) {
                            out.extend_from_slice(&f.raw);
                        }
                    }
                    _ => out.extend_from_slice(&f.raw),
                }
            }
            b'C' | b'I' | b'V' => self.on_complete(f, out),
            b's' => self.on_suspended(f, out),
            b'E' => self.on_error(f, out, secrets),
            b'Z' => {
                self.tx_status = f.body().first().copied().unwrap_or(b'I');
                match self.fifo.pop_front() {
                    Some(Pending::Simple { stmts }) => {
                        for s in stmts {
                            self.log_outcome(&s, None, None, true);
                        }
                    }
                    Some(Pending::Sync) | Some(Pending::Denied { .. }) | None => {
                        // Protocol-level portals end with their transaction.
                        if self.tx_status == b'I' && self.fifo.is_empty() && self.outbox.is_empty()
                        {
                            self.portals.clear();
                            self.portal_bytes = 0;
                        }
                    }
                    Some(other) => {
                        // Out of step (should not happen): keep the entry, relay anyway.
                        tracing::warn!("ReadyForQuery while waiting for another response");
                        self.fifo.push_front(other);
                    }
                }
                out.extend_from_slice(&f.raw);
            }
            b'N' => match messages::scrub_error(f.tag, f.body(), secrets) {
                Some(s) => out.extend_from_slice(&s),
                None => out.extend_from_slice(&f.raw),
            },
            _ => out.extend_from_slice(&f.raw),
        }
    }

    fn on_row(&mut self, f: Frame, out: &mut BytesMut) {
        let policy = self.id.caps;
        let Some(s) = self.current() else {
            out.extend_from_slice(&f.raw);
            return;
        };
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
            messages::command_tag(f.body()).map(str::to_string)
        } else {
            None
        };
        match self.fifo.pop_front() {
            Some(Pending::Execute { stmt, .. }) => self.finish(stmt, Some(f.raw), tag, out),
            Some(Pending::Simple { mut stmts }) => {
                if let Some(stmt) = stmts.pop_front() {
                    self.finish(stmt, Some(f.raw), tag, out);
                } else {
                    out.extend_from_slice(&f.raw);
                }
                self.fifo.push_front(Pending::Simple { stmts });
            }
            Some(other) => {
                self.fifo.push_front(other);
                out.extend_from_slice(&f.raw);
            }
            None => out.extend_from_slice(&f.raw),
        }
    }

    fn on_suspended(&mut self, f: Frame, out: &mut BytesMut) {
        match self.fifo.pop_front() {
            Some(Pending::Execute { stmt, .. }) if stmt.lowered => {
                self.finish(stmt, None, None, out)
            }
            Some(Pending::Execute { stmt, .. }) => {
                // The client's own max_rows: a cursor-style fetch, passed on as is.
                self.log_outcome(&stmt, None, Some("(portal suspended)"), false);
                out.extend_from_slice(&f.raw);
            }
            Some(other) => {
                self.fifo.push_front(other);
                out.extend_from_slice(&f.raw);
            }
            None => out.extend_from_slice(&f.raw),
        }
    }

    /// A statement's result ended (with its completion message, or None when the portal
    /// was suspended by our lowered max_rows).
    fn finish(
        &mut self,
        mut stmt: Stmt,
        completion: Option<Bytes>,
        tag: Option<String>,
        out: &mut BytesMut,
    ) {
        let policy = self.id.caps;
        if !stmt.count.truncated {
            for r in stmt.held.drain(..) {
                out.extend_from_slice(&r);
            }
            match completion {
                Some(c) => out.extend_from_slice(&c),
                // Suspended exactly at cap + 1 can only mean truncated; be safe anyway.
                None => out.extend_from_slice(&messages::command_complete(&format!(
                    "{} {}",
                    stmt.verb, stmt.count.rows
                ))),
            }
            self.log_outcome(&stmt, None, tag.as_deref(), false);
            return;
        }
        if policy.mode == CapMode::Error && stmt.lowered {
            // Make the backend itself fail here, so the transaction state and the skipping of
            // the rest of the pipeline are real, then show the client a clean 54000.
            stmt.held.clear();
            self.log_outcome(&stmt, Some("54000".into()), None, false);
            let sql = "DO $sandpit$ BEGIN RAISE EXCEPTION 'sandpit cap' USING ERRCODE = '54000'; END $sandpit$";
            let mut bytes = BytesMut::new();
            bytes.extend_from_slice(&frontend::build_parse(b"", sql.as_bytes()));
            bytes.extend_from_slice(&frontend::build_bind(b"", b""));
            bytes.extend_from_slice(&frontend::build_execute(b"", 0));
            self.outbox.push_front(Outgoing {
                bytes: bytes.freeze(),
                pending: vec![
                    Pending::Parse { swallow: true },
                    Pending::Bind { swallow: true },
                    Pending::InjectedError,
                ],
            });
            return;
        }
        out.extend_from_slice(&policy.notice(stmt.count.rows, stmt.count.by_bytes));
        let shown = match (&tag, stmt.lowered, stmt.copy_out) {
            // Rows were drained: the backend's tag (rows affected) is the truth.
            (Some(t), false, false) => t.clone(),
            (_, _, true) => format!("COPY {}", stmt.count.rows),
            _ => format!("{} {}", stmt.verb, stmt.count.rows),
        };
        out.extend_from_slice(&messages::command_complete(&shown));
        self.log_outcome(&stmt, None, Some(&shown), false);
    }

    fn on_error(&mut self, f: Frame, out: &mut BytesMut, secrets: &[String]) {
        let code = messages::error_code(f.body());
        let scrubbed =
            messages::scrub_error(f.tag, f.body(), secrets).unwrap_or_else(|| f.raw.clone());
        match self.fifo.front_mut() {
            Some(Pending::Denied { message }) => {
                out.extend_from_slice(&messages::error_response(Severity::Error, "42501", message));
            }
            Some(Pending::Simple { stmts }) => {
                // The rest of a simple query is skipped by the server; ReadyForQuery follows.
                let failed = stmts.pop_front();
                let skipped: Vec<Stmt> = stmts.drain(..).collect();
                if let Some(s) = failed {
                    self.log_outcome(&s, code, None, false);
                }
                for s in skipped {
                    self.log_outcome(&s, None, None, true);
                }
                out.extend_from_slice(&scrubbed);
            }
            Some(_) => {
                // Extended protocol: the server skips everything up to the next Sync.
                let mut first = true;
                let mut injected = false;
                let mut denial = None;
                // Only the entry at the front failed; a refusal behind it was merely skipped.
                let refused = matches!(self.fifo.front(), Some(Pending::Refused));
                while let Some(p) = self.fifo.front() {
                    if matches!(p, Pending::Sync) {
                        break;
                    }
                    match self.fifo.pop_front() {
                        Some(Pending::Execute { stmt, .. }) => {
                            if first && stmt.denied {
                                denial = Some(self.denial_message(stmt.kind));
                                self.log_outcome(&stmt, Some("42501".into()), None, false);
                            } else if first {
                                self.log_outcome(&stmt, code.clone(), None, false);
                            } else {
                                self.log_outcome(&stmt, None, None, true);
                            }
                            first = false;
                        }
                        Some(Pending::InjectedError) => injected = true,
                        Some(Pending::Simple { stmts }) => {
                            for s in stmts {
                                self.log_outcome(&s, None, None, true);
                            }
                        }
                        _ => {}
                    }
                }
                // Messages not yet sent up to the next Sync are skipped by the server too: they
                // are still sent, but nothing is expected from them.
                if self.fifo.is_empty() {
                    self.skip_until_sync = true;
                }
                if let Some(msg) = denial {
                    out.extend_from_slice(&messages::error_response(
                        Severity::Error,
                        "42501",
                        &msg,
                    ));
                } else if refused {
                    let msg = format!(
                        "sandpit: this session already holds {MAX_TRACKED} named prepared statements \
                         or portals, or {} MiB of their text; close some (protocol Close) before \
                         making more",
                        MAX_TRACKED_BYTES >> 20
                    );
                    out.extend_from_slice(&messages::error_response(
                        Severity::Error,
                        "53400",
                        &msg,
                    ));
                } else if injected {
                    let msg = self.id.caps.error_text();
                    out.extend_from_slice(&messages::error_response(
                        Severity::Error,
                        "54000",
                        &msg,
                    ));
                } else {
                    out.extend_from_slice(&scrubbed);
                }
            }
            None => out.extend_from_slice(&scrubbed),
        }
    }
}
