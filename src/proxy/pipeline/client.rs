//! The client side of the pipeline: each message is logged (before it is forwarded) and
//! turned into what goes to the backend, with the responses it will cause.

use std::collections::VecDeque;
use std::sync::Arc;

use super::log::text_of;
use super::names::Lookup;
use super::outbox::put_message;
use super::owned::Role;
use super::policy::DENY_SQL;
use super::*;
use crate::journal::classify;
use crate::journal::log::param_text;
use crate::proxy::caps::CapMode;
use crate::wire::messages::frontend;

impl Pipeline {
    /// A message from the client: log it, decide what goes to the backend. A message that
    /// depends on a name the server has not confirmed yet (from an earlier Sync) waits, and
    /// so does everything after it.
    pub fn on_client(&mut self, f: Frame) {
        if !self.held.is_empty() || self.must_wait(&f) {
            self.held.push_back(f);
            return;
        }
        self.process_client(f);
    }

    /// Process held messages whose answers have arrived.
    pub(super) fn release_held(&mut self) {
        while let Some(f) = self.held.pop_front() {
            if self.must_wait(&f) {
                self.held.push_front(f);
                return;
            }
            self.process_client(f);
        }
    }

    /// Whether `f` needs the answer to a change sent in an earlier group.
    fn must_wait(&self, f: &Frame) -> bool {
        let g = self.group;
        if !self.prepared.waits_before(g) && !self.portals.waits_before(g) {
            // Nothing from an earlier group is unanswered: no name can make it wait (the
            // common case, decided without parsing the message).
            return false;
        }
        match f.tag {
            b'P' => match frontend::parse(f.body()) {
                // A named Parse fails if the name exists: that must be known; SQL in it that
                // names a protocol statement or portal is sent with the server's name.
                Some((name, query)) => {
                    (!name.is_empty() && self.prepared.lookup(name, g).is_wait())
                        || self.sql_name_waits(query)
                }
                None => false,
            },
            b'B' => match frontend::bind_names(f.body()) {
                Some((portal, statement)) => {
                    self.prepared.lookup(statement, g).is_wait()
                        || (!portal.is_empty() && self.portals.lookup(portal, g).is_wait())
                }
                None => false,
            },
            b'E' => match frontend::execute(f.body()) {
                Some((portal, _)) => self.portals.lookup(portal, g).is_wait(),
                None => false,
            },
            // SQL naming a protocol statement or portal goes by its backend name too.
            b'Q' => self.sql_name_waits(f.body()),
            // Their backend name depends on the answer too.
            b'D' | b'C' => match frontend::target(f.body()) {
                Some((b'S', name)) => self.prepared.lookup(name, g).is_wait(),
                Some((_, name)) => self.portals.lookup(name, g).is_wait(),
                None => false,
            },
            _ => false,
        }
    }

    fn process_client(&mut self, f: Frame) {
        match f.tag {
            b'Q' => {
                self.on_query(f);
                self.group += 1;
            }
            b'P' => self.on_parse(f),
            b'B' => self.on_bind(f),
            b'E' => self.on_execute(f),
            b'D' => self.on_describe(f),
            b'C' => self.on_close(f),
            b'S' => {
                self.group += 1;
                if self.copy_in_until == Some(self.copy_ends) {
                    // Inside COPY FROM STDIN the server ignores Sync: nothing will answer it.
                    self.ignored_syncs += 1;
                    self.push(f.raw, []);
                } else {
                    let copy_ends_before = self.copy_ends;
                    self.push(f.raw, [Pending::Sync { copy_ends_before }]);
                }
            }
            b'F' => {
                self.on_function_call(f);
                self.group += 1;
            }
            b'c' | b'f' => {
                // CopyDone / CopyFail: ends the COPY FROM STDIN in progress, if any.
                self.copy_ends += 1;
                if matches!(self.copy_in_until, Some(n) if n < self.copy_ends) {
                    self.copy_in_until = None;
                }
                self.push(f.raw, []);
            }
            // Flush, Terminate, COPY data from the client and anything unknown: no response of
            // their own that we track (the backend answers unknown messages with an error,
            // which is matched like any other).
            _ => self.push(f.raw, []),
        }
    }

    fn on_parse(&mut self, f: Frame) {
        let Some((name, query)) = frontend::parse(f.body()) else {
            return self.push(
                f.raw,
                [Pending::Parse {
                    swallow: false,
                    change: None,
                }],
            );
        };
        if name.is_empty() {
            self.stmt_dirty = false;
        }
        if over_limit(
            self.prepared.len(),
            name,
            self.tracked_bytes() + name.len() + query.len(),
        ) {
            return self.refuse();
        }
        // A name with a live mapping keeps its backend name: the server refuses the Parse
        // while it holds that statement and accepts it once it forgot it (DISCARD ALL,
        // DEALLOCATE); either way the mapping follows its answer.
        let target = {
            let lookup = self.prepared.lookup(name, self.group);
            self.backend_names
                .define(name, &lookup, |p| p.backend, Role::Statement)
        };
        let change = {
            let (text, kind, may_read_catalogs) = match &self.last_parsed {
                Some((t, k, c)) if t.as_bytes() == query => (t.clone(), *k, *c),
                _ => {
                    // One copy of valid UTF-8 (not to a String, then again to the Arc).
                    let text: Arc<str> = match String::from_utf8_lossy(query) {
                        std::borrow::Cow::Borrowed(t) => Arc::from(t),
                        std::borrow::Cow::Owned(t) => Arc::from(t),
                    };
                    let kind = classify::classify(&text);
                    let catalogs = classify::may_read_catalogs(&text);
                    self.last_parsed = Some((text.clone(), kind, catalogs));
                    (text, kind, catalogs)
                }
            };
            self.parses += 1;
            let p = Prepared {
                text,
                catalog: false,
                id: self.parses,
                kind,
                may_read_catalogs,
                backend: target.0,
            };
            self.prepared.propose(name, Some(p), self.group);
            Some(Change::Stmt(name.to_vec()))
        };
        let pending = Pending::Parse {
            swallow: false,
            change,
        };
        // SQL in it naming a protocol statement or portal (asyncpg's `fetchval('EXECUTE
        // name')`) goes by the server's name, as in a Query.
        let renamed = self.sql_renamed(query);
        if name.is_empty() && renamed.is_none() {
            return self.push(f.raw, [pending]);
        }
        let lens = (name.len(), query.len());
        self.push_parse_as(&f, lens, target, renamed, pending);
    }

    /// A Parse sent with the backend's statement name and, when `renamed`, that text in
    /// place of the client's (`lens`: the client's name and text lengths). Out of line: the
    /// unnamed Parse of plain SQL is relayed as read.
    #[inline(never)]
    fn push_parse_as(
        &mut self,
        f: &Frame,
        (name_len, query_len): (usize, usize),
        target: super::owned::Target,
        renamed: Option<Vec<u8>>,
        pending: Pending,
    ) {
        let backend = self.backend_names.render(target);
        let name_sent = if name_len == 0 {
            &b""[..]
        } else {
            backend.as_bytes()
        };
        let rest = &f.body()[name_len + 1..];
        let (text, types) = match &renamed {
            Some(sql) => (&sql[..], &rest[query_len..]),
            None => (&rest[..0], rest),
        };
        self.outbox.push_built(|out| {
            put_message(out, b'P', &[name_sent, b"\0", text, types]);
            [pending]
        });
    }

    fn on_bind(&mut self, f: Frame) {
        self.binds += 1;
        // What a Bind does to the unnamed statement and portal holds whether or not the
        // gateway can read its values (the server may: it decides).
        if let Some((portal, statement)) = frontend::bind_names(f.body()) {
            self.before_bind(portal.is_empty(), statement.is_empty());
        }
        let Some(b) = frontend::bind(f.body()) else {
            return self.on_unreadable_bind(f);
        };
        let (stmt, stmt_target) = {
            let lookup = self.prepared.lookup(b.statement, self.group);
            let target =
                self.backend_names
                    .refer(b.statement, &lookup, |p| p.backend, Role::Statement);
            match lookup {
                Lookup::Defined(p) => (Some(p.clone()), target),
                _ => (None, target),
            }
        };
        // A statement the gateway has no mapping for fails on the server (never defined
        // there): the portal is not made. A portal with a live mapping keeps its backend
        // name (refused while the server holds it, as the client's own name would be).
        let portal_target = {
            let lookup = self.portals.lookup(b.portal, self.group);
            let n = &mut self.backend_names;
            match stmt {
                Some(_) => n.define(b.portal, &lookup, |p| p.backend, Role::Portal),
                None => n.refer(b.portal, &lookup, |p| p.backend, Role::Portal),
            }
        };
        let change = match stmt {
            Some(Prepared {
                text,
                catalog,
                id,
                kind,
                may_read_catalogs,
                ..
            }) => {
                let mut params = std::mem::take(&mut self.spare_params);
                params.extend(b.params.iter().map(|(fmt, v)| param_text(fmt, v)));
                let portal = Portal {
                    text,
                    params,
                    catalog,
                    statement_id: id,
                    kind,
                    may_read_catalogs,
                    backend: portal_target.0,
                };
                let size = b.portal.len() + portal.weight();
                if over_limit(self.portals.len(), b.portal, self.tracked_bytes() + size) {
                    return self.refuse();
                }
                self.portals.propose(b.portal, Some(portal), self.group);
                Some(Change::Portal(b.portal.to_vec()))
            }
            _ => None,
        };
        let pending = Pending::Bind {
            swallow: false,
            change,
        };
        let names = (b.portal.len(), b.statement.len());
        self.push_bind(f, names, (portal_target, stmt_target), pending);
    }

    /// Before a Bind of the unnamed statement and/or portal goes out.
    fn before_bind(&mut self, unnamed_portal: bool, unnamed_statement: bool) {
        if self.stmt_dirty && unnamed_statement {
            self.close_unnamed_statement();
        }
        if unnamed_portal {
            // A Bind replaces the unnamed portal whatever it held.
            self.portal_dirty = false;
        }
    }

    fn tracked_bytes(&self) -> usize {
        self.prepared.bytes() + self.portals.bytes()
    }

    /// Answer a Parse/Bind over the limit with 53400 through the backend's own error path.
    fn refuse(&mut self) {
        metrics::counter!("sandpit_tracking_limit_refusals_total").increment(1);
        // A failing unnamed Parse drops the client's unnamed statement on the server.
        self.stmt_dirty = true;
        self.push(frontend::build_parse(b"", REFUSED_SQL), [Pending::Refused]);
    }

    fn on_function_call(&mut self, f: Frame) {
        let (oid, params): (u32, Vec<Option<String>>) = match frontend::function_call(f.body()) {
            Some((oid, args)) => (
                oid,
                args.iter().map(|(fmt, v)| param_text(fmt, v)).collect(),
            ),
            None => (0, Vec::new()),
        };
        let mut stmt = self.new_stmt("function", &format!("function call oid={oid}"), &params);
        stmt.function = true;
        if self.denies(stmt.kind) {
            return self.deny_simple(VecDeque::from([stmt]));
        }
        if stmt.refused_by_log() {
            return self.refuse_unlogged(VecDeque::from([stmt]));
        }
        self.push(
            f.raw,
            [Pending::Simple {
                stmts: VecDeque::from([stmt]),
            }],
        );
    }

    fn on_query(&mut self, f: Frame) {
        let body = f.body();
        let text_bytes = body.strip_suffix(&[0]).unwrap_or(body);
        let text = text_of(text_bytes);
        // Splitting only decides whether the backend can be stopped early; caps are counted
        // from the backend's stream whatever it finds.
        let mut ranges = std::mem::take(&mut self.spare_ranges);
        let split = classify::split_ranges(&text, &mut ranges)
            && ranges.len() <= MAX_SPLIT_STATEMENTS
            && !ranges.is_empty();
        let pieces = || ranges.iter().map(|r| &text[r.clone()]);
        // COPY runs as the client sent it: inside an extended-protocol rewrite, a COPY FROM
        // STDIN would swallow the gateway's own Sync.
        let rewrite = split
            && rows_without_copy(pieces())
            // Only the client's own bytes are rewritten (not a lossy decoding).
            && matches!(text, std::borrow::Cow::Borrowed(_));
        // The server drops its unnamed statement and portal at every Query (the rewrite
        // below leaves the gateway's own there instead).
        self.stmt_dirty = true;
        self.portal_dirty = true;
        let mut stmts = std::mem::take(&mut self.spare_stmts);
        if split {
            stmts.extend(pieces().map(|s| self.new_stmt("simple", s, &[])));
        } else {
            stmts.push_back(self.new_stmt("simple", &text, &[]));
        }
        if self.id.allow.is_some() && stmts.iter().any(|s| self.denies(s.kind)) {
            // Judged statement by statement; one refusal rejects the whole string.
            self.spare_ranges = ranges;
            return self.deny_simple(stmts);
        }
        if stmts.iter().any(Stmt::refused_by_log) {
            self.spare_ranges = ranges;
            return self.refuse_unlogged(stmts);
        }
        // A protocol statement or portal named by SQL goes by the name the server holds (the
        // log keeps the client's text); the rewrite below renames each of several statements
        // on its own.
        let renamed = if split && ranges.len() > 1 && rewrite {
            None
        } else {
            self.sql_renamed(text_bytes)
        };
        if !rewrite {
            let sent = renamed.map(|sql| {
                let mut out = Vec::with_capacity(sql.len() + 6);
                put_message(&mut out, b'Q', &[&sql, b"\0"]);
                Bytes::from(out)
            });
            // The text borrows the frame's bytes: done with before its bytes move on.
            drop(text);
            self.spare_ranges = ranges;
            self.push(sent.unwrap_or(f.raw), [Pending::Simple { stmts }]);
            return;
        }
        // Run each statement as Parse/Bind/Describe/Execute(max_rows)/…/Sync: one implicit
        // transaction and skip-on-error, like a simple query, but the backend stops at the cap.
        let error_mode = self.id.caps.mode == CapMode::Error;
        for (range, mut stmt) in ranges.iter().zip(stmts.drain(..)) {
            let piece = &text[range.clone()];
            // A text of one statement was renamed whole; each of several is renamed alone.
            let own = match ranges.len() {
                1 => None,
                _ => self.sql_renamed(piece.as_bytes()),
            };
            let sent = own
                .as_deref()
                .or(renamed.as_deref())
                .unwrap_or(piece.as_bytes());
            let lower = self.stops_early(&stmt, classify::may_read_catalogs(piece));
            self.binds += 1;
            let key = Some((Vec::new(), self.binds));
            stmt.portal_key = key.clone();
            let max = if lower {
                self.id.caps.lowered(0).unwrap_or(0)
            } else {
                0
            };
            stmt.lowered = lower;
            let barrier = error_mode && lower;
            let stmt = self.boxed(stmt);
            self.outbox
                .unnamed_run(sent, max, key, Pending::Execute { stmt, barrier });
        }
        self.spare_ranges = ranges;
        self.recycle_stmts(stmts);
        let copy_ends_before = self.copy_ends;
        self.push(sync_message(), [Pending::Sync { copy_ends_before }]);
    }

    fn on_execute(&mut self, f: Frame) {
        let Some((portal, asked)) = frontend::execute(f.body()) else {
            self.push(f.raw, []);
            return;
        };
        let portal = portal.to_vec();
        if self.portal_dirty && portal.is_empty() {
            self.close_unnamed_portal();
        }
        // Logged with the text and parameters the portal holds (borrowed, not copied), as
        // the kind found when it was parsed.
        let lookup = self.portals.lookup(&portal, self.group);
        let target = self
            .backend_names
            .refer(&portal, &lookup, |p| p.backend, Role::Portal);
        let (may_read_catalogs, mut stmt) = match lookup {
            Lookup::Defined(p) => {
                let mut stmt = self.new_stmt_as("extended", &p.text, &p.params, p.kind);
                stmt.count.catalog = p.catalog;
                stmt.statement_id = Some(p.statement_id);
                (p.may_read_catalogs, stmt)
            }
            _ => (false, self.new_stmt("extended", "", &[])),
        };
        let refusal = if self.denies(stmt.kind) {
            stmt.denied = true;
            metrics::counter!("sandpit_denied_statements_total", "kind" => stmt.kind.as_str())
                .increment(1);
            true
        } else {
            stmt.refused_by_log()
        };
        if refusal {
            // The refusal is raised by the backend in place of this Execute (the rest of the
            // pipeline is then skipped up to Sync, as after any error). Its unnamed
            // statement and portal are the gateway's: closed before the client relies on
            // them again.
            self.stmt_dirty = true;
            self.portal_dirty = true;
            let stmt = self.boxed(stmt);
            self.outbox.unnamed_run(
                DENY_SQL.as_bytes(),
                0,
                None,
                Pending::Execute {
                    stmt,
                    barrier: false,
                },
            );
            return;
        }
        let error_mode = self.id.caps.mode == CapMode::Error;
        let lowered = if self.stops_early(&stmt, may_read_catalogs) {
            self.id.caps.lowered(asked)
        } else {
            None
        };
        stmt.copy_ends_before = self.copy_ends;
        stmt.portal_key = Some((portal.clone(), self.binds));
        match lowered {
            Some(max) => {
                stmt.lowered = true;
                let execute = Pending::Execute {
                    stmt: self.boxed(stmt),
                    barrier: error_mode,
                };
                if !portal.is_empty() {
                    self.portals.propose(&portal, None, self.group);
                }
                let buf = self.backend_names.render(target);
                let own = (target.1 == Role::Client).then(|| portal.clone());
                let backend = own.as_deref().unwrap_or(buf.as_bytes());
                self.outbox.push_built(|out| {
                    put_message(out, b'E', &[backend, b"\0", &max.to_be_bytes()]);
                    // A cut portal is finished as far as the client knows: close it.
                    let close = (!portal.is_empty()).then(|| {
                        put_message(out, b'C', &[b"P", backend, b"\0"]);
                        Pending::Close {
                            swallow: true,
                            change: Some(Change::Portal(portal)),
                        }
                    });
                    [Some(execute), close].into_iter().flatten()
                });
            }
            None => {
                let stmt = self.boxed(stmt);
                let pending = Pending::Execute {
                    stmt,
                    barrier: false,
                };
                if target.0 == 0 {
                    // The unnamed portal, or an SQL cursor's own name: as read.
                    return self.push(f.raw, [pending]);
                }
                let backend = self.backend_names.render(target);
                self.outbox.push_built(|out| {
                    let parts: [&[u8]; 3] = [backend.as_bytes(), b"\0", &asked.to_be_bytes()];
                    put_message(out, b'E', &parts);
                    [pending]
                });
            }
        }
    }

    /// Whether the backend is asked to stop right after the row cap: in error mode always;
    /// otherwise for what the classifier takes for a read, unless it may read catalogs (a
    /// driver's catalog query is passed whole when its RowDescription shows only catalog
    /// columns) — a write's RETURNING rows are all owed. A wrong guess costs only the early
    /// stop: every result is still counted and capped from the stream.
    fn stops_early(&self, stmt: &Stmt, may_read_catalogs: bool) -> bool {
        self.id.caps.mode == CapMode::Error || (stmt.kind != Kind::Write && !may_read_catalogs)
    }

    /// Close the unnamed statement the gateway's own messages may have left behind, before a
    /// client Bind of it: on a real server a Query would have dropped the client's, so the
    /// Bind fails as it should.
    fn close_unnamed_statement(&mut self) {
        self.stmt_dirty = false;
        self.prepared.propose(b"", None, self.group);
        self.outbox.push_built(|out| {
            put_message(out, b'C', &[b"S\0"]);
            [Pending::Close {
                swallow: true,
                change: Some(Change::Stmt(Vec::new())),
            }]
        });
    }

    /// Close the unnamed portal the gateway's own messages left behind, before a client
    /// Execute of the unnamed portal (on a real server a Query would have dropped it).
    fn close_unnamed_portal(&mut self) {
        self.portal_dirty = false;
        self.portals.propose(b"", None, self.group);
        self.outbox.push_built(|out| {
            put_message(out, b'C', &[b"P\0"]);
            [Pending::Close {
                swallow: true,
                change: Some(Change::Portal(Vec::new())),
            }]
        });
    }
}

/// A named entry that would go past MAX_TRACKED entries or MAX_TRACKED_BYTES (the unnamed
/// one is always allowed: it replaces itself and is bounded by the message size).
fn over_limit(entries: usize, name: &[u8], bytes_after: usize) -> bool {
    !name.is_empty() && (entries >= MAX_TRACKED || bytes_after > MAX_TRACKED_BYTES)
}

/// Whether some statement may return rows and none is a COPY (as `any(may_return_rows)`
/// and no `leading_word_is(_, "COPY")`), each statement's first word read once.
fn rows_without_copy<'t>(pieces: impl Iterator<Item = &'t str>) -> bool {
    let mut rows = false;
    for p in pieces {
        let (r, copy) = classify::rows_and_copy(p);
        if copy {
            return false;
        }
        rows |= r;
    }
    rows
}
