//! The relay's view of the protocol: every client message is logged and turned into what
//! goes to the backend, together with the responses it will cause (a FIFO, as PgDog keeps);
//! every backend message is matched against that FIFO so results can be capped, statement
//! outcomes logged, and the client still sees a correct sequence of tags and transaction
//! states. Messages the gateway does not change are passed on as the bytes that were read.

mod log;
mod policy;
mod responses;

use log::{log_param, text_of};
use policy::DENY_SQL;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::caps::{CapMode, CapPolicy, ResultCount};
use crate::review::classify::{self, Kind};
use crate::review::log::TokenLog;
use crate::wire::frame::Frame;
use crate::wire::messages::{self, frontend, Severity};

/// Most named prepared statements / portals a session may keep (bounds gateway memory); one
/// more is refused with SQLSTATE 53400.
pub const MAX_TRACKED: usize = 10_000;
/// Most bytes of statement text and logged parameters those may hold per session (the
/// count alone would let 10 000 huge statements pile up in the gateway).
pub const MAX_TRACKED_BYTES: usize = 32 * 1024 * 1024;
/// What the backend is given instead of a refused Parse or Bind: it fails at parse time, so
/// the backend's own error state (skip to Sync, aborted transaction) matches what the client
/// is told.
const REFUSED_SQL: &[u8] = b"sandpit refused this message";

/// Who the session is, for log records.
pub struct SessionIdentity {
    /// Token id.
    pub token: String,
    /// Task name.
    pub task: String,
    /// Session number in this process.
    pub session: u64,
    /// The token's log (None when statement logging is turned off in config).
    pub log: Option<Arc<TokenLog>>,
    /// Caps.
    pub caps: CapPolicy,
    /// Seatbelt policy: statement kinds allowed (None = all).
    pub allow: Option<Vec<String>>,
}

/// A statement on its way through the backend.
struct Stmt {
    seq: u64,
    kind: Kind,
    started: Instant,
    count: ResultCount,
    /// Rows held back in error mode until the result is known to fit.
    held: Vec<Bytes>,
    copy_out: bool,
    /// Lowered Execute.max_rows: the backend stops at cap + 1.
    lowered: bool,
    /// FETCH / SELECT for the tag of a cut result.
    verb: &'static str,
    /// Refused by the seatbelt policy.
    denied: bool,
}

enum Pending {
    Parse {
        swallow: bool,
    },
    Bind {
        swallow: bool,
    },
    Describe {
        swallow_nodata: bool,
    },
    Execute {
        stmt: Stmt,
        barrier: bool,
    },
    /// The statement the gateway injected to fail a capped result in error mode.
    InjectedError,
    /// A Parse or Bind over MAX_TRACKED, replaced by a failing Parse.
    Refused,
    Close {
        swallow: bool,
    },
    Sync,
    /// A simple Query (or FunctionCall) relayed as is: responses until ReadyForQuery.
    Simple {
        stmts: VecDeque<Stmt>,
    },
    /// A simple Query or FunctionCall replaced by the policy refusal: an error, then
    /// ReadyForQuery.
    Denied {
        message: String,
    },
}

/// Bytes for the backend with the responses they will cause.
struct Outgoing {
    bytes: Bytes,
    pending: Vec<Pending>,
}

struct Portal {
    text: Arc<str>,
    params: Vec<Option<String>>,
}

/// Protocol state of one relayed session.
pub struct Pipeline {
    id: SessionIdentity,
    fifo: VecDeque<Pending>,
    outbox: VecDeque<Outgoing>,
    prepared: HashMap<Vec<u8>, Arc<str>>,
    portals: HashMap<Vec<u8>, Portal>,
    /// Bytes held by `prepared` (names and texts) and by `portals` (names and parameters).
    prepared_bytes: usize,
    portal_bytes: usize,
    /// Transaction status from the last ReadyForQuery.
    pub tx_status: u8,
    /// An extended-protocol error happened and its Sync has not been forwarded yet: the
    /// server answers nothing until then, so nothing is expected either.
    skip_until_sync: bool,
}

impl Pipeline {
    /// New state for a session that just got its first ReadyForQuery.
    pub fn new(id: SessionIdentity) -> Pipeline {
        Pipeline {
            id,
            fifo: VecDeque::new(),
            outbox: VecDeque::new(),
            prepared: HashMap::new(),
            portals: HashMap::new(),
            prepared_bytes: 0,
            portal_bytes: 0,
            tx_status: b'I',
            skip_until_sync: false,
        }
    }

    /// Whether forwarding must wait for an earlier result (error mode needs to know whether
    /// a result fits before anything after it reaches the backend).
    pub fn blocked(&self) -> bool {
        self.fifo
            .iter()
            .any(|p| matches!(p, Pending::Execute { barrier: true, .. }))
    }

    /// Move what may be sent now into `to_backend`.
    pub fn drain_outbox(&mut self, to_backend: &mut BytesMut) {
        while !self.blocked() {
            let Some(o) = self.outbox.pop_front() else {
                break;
            };
            to_backend.extend_from_slice(&o.bytes);
            let barrier = o
                .pending
                .iter()
                .any(|p| matches!(p, Pending::Execute { barrier: true, .. }));
            if barrier {
                // The backend only flushes at Sync or Flush; we hold the Sync back, so ask.
                to_backend.extend_from_slice(&crate::wire::frame::build(b'H', &[]));
            }
            for p in o.pending {
                if !self.skip_until_sync {
                    self.fifo.push_back(p);
                    continue;
                }
                match p {
                    Pending::Sync => {
                        self.skip_until_sync = false;
                        self.fifo.push_back(p);
                    }
                    Pending::Execute { stmt, .. } => self.log_outcome(&stmt, None, None, true),
                    _ => {}
                }
            }
        }
    }

    /// Nothing waits to be forwarded.
    pub fn outbox_empty(&self) -> bool {
        self.outbox.is_empty()
    }

    /// A message from the client: log it, decide what goes to the backend.
    pub fn on_client(&mut self, f: Frame) {
        match f.tag {
            b'Q' => self.on_query(f),
            b'P' => {
                if let Some((name, query)) = frontend::parse(f.body()) {
                    let size = name.len() + query.len();
                    let held = self.prepared_bytes + self.portal_bytes;
                    if over_limit(&self.prepared, name, held + size) {
                        return self.refuse();
                    }
                    let text: Arc<str> = Arc::from(text_of(query));
                    if let Some(old) = self.prepared.insert(name.to_vec(), text) {
                        self.prepared_bytes =
                            self.prepared_bytes.saturating_sub(name.len() + old.len());
                    }
                    self.prepared_bytes +=
                        name.len() + self.prepared.get(name).map_or(0, |t| t.len());
                }
                self.push(f.raw, vec![Pending::Parse { swallow: false }]);
            }
            b'B' => {
                if let Some(b) = frontend::bind(f.body()) {
                    let text = self
                        .prepared
                        .get(b.statement)
                        .cloned()
                        .unwrap_or_else(|| Arc::from(""));
                    let params = b
                        .params
                        .iter()
                        .map(|(fmt, v)| log_param(*fmt, *v))
                        .collect();
                    let portal = Portal { text, params };
                    let size = portal_size(b.portal, &portal);
                    let held = self.prepared_bytes + self.portal_bytes;
                    if over_limit(&self.portals, b.portal, held + size) {
                        return self.refuse();
                    }
                    if let Some(old) = self.portals.insert(b.portal.to_vec(), portal) {
                        self.portal_bytes = self
                            .portal_bytes
                            .saturating_sub(portal_size(b.portal, &old));
                    }
                    self.portal_bytes += size;
                }
                self.push(f.raw, vec![Pending::Bind { swallow: false }]);
            }
            b'E' => self.on_execute(f),
            b'D' => self.push(
                f.raw,
                vec![Pending::Describe {
                    swallow_nodata: false,
                }],
            ),
            b'C' => {
                if let Some((kind, name)) = frontend::target(f.body()) {
                    if kind == b'S' {
                        if let Some(old) = self.prepared.remove(name) {
                            self.prepared_bytes =
                                self.prepared_bytes.saturating_sub(name.len() + old.len());
                        }
                    } else if let Some(old) = self.portals.remove(name) {
                        self.portal_bytes =
                            self.portal_bytes.saturating_sub(portal_size(name, &old));
                    }
                }
                self.push(f.raw, vec![Pending::Close { swallow: false }]);
            }
            b'S' => self.push(f.raw, vec![Pending::Sync]),
            b'F' => {
                let oid = f
                    .body()
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                    .unwrap_or(0);
                let stmt =
                    self.new_stmt("function", &format!("function call oid={oid}"), Vec::new());
                if self.denies(stmt.kind) {
                    self.deny_simple(VecDeque::from([stmt]));
                } else {
                    self.push(
                        f.raw,
                        vec![Pending::Simple {
                            stmts: VecDeque::from([stmt]),
                        }],
                    );
                }
            }
            // Flush, Terminate, COPY data from the client and anything unknown: no response of
            // their own that we track (the backend answers unknown messages with an error,
            // which is matched like any other).
            _ => self.push(f.raw, Vec::new()),
        }
    }

    /// Answer a Parse/Bind over the limit with 53400 through the backend's own error path.
    fn refuse(&mut self) {
        metrics::counter!("sandpit_tracking_limit_refusals_total").increment(1);
        self.push(
            frontend::build_parse(b"", REFUSED_SQL),
            vec![Pending::Refused],
        );
    }

    fn push(&mut self, bytes: Bytes, pending: Vec<Pending>) {
        self.outbox.push_back(Outgoing { bytes, pending });
    }

    fn on_query(&mut self, f: Frame) {
        let body = f.body();
        let text_bytes = body.strip_suffix(&[0]).unwrap_or(body);
        let text = text_of(text_bytes);
        let pieces = classify::split(&text);
        let rewrite = match &pieces {
            Some(p) => {
                !p.is_empty()
                    && p.iter().any(|s| classify::may_return_rows(s))
                    && text.len() == text_bytes.len()
            }
            None => false,
        };
        if self.id.allow.is_some() {
            // Judged statement by statement; one refusal rejects the whole string.
            let kinds: Vec<Kind> = match &pieces {
                Some(p) if !p.is_empty() => p.iter().map(|s| classify::classify(s)).collect(),
                _ => vec![classify::classify(&text)],
            };
            if kinds.iter().any(|k| self.denies(*k)) {
                let stmts: VecDeque<Stmt> = match &pieces {
                    Some(p) if !p.is_empty() => p
                        .iter()
                        .map(|s| self.new_stmt("simple", s, Vec::new()))
                        .collect(),
                    _ => VecDeque::from([self.new_stmt("simple", &text, Vec::new())]),
                };
                self.deny_simple(stmts);
                return;
            }
        }
        if !rewrite {
            let stmts: VecDeque<Stmt> = match &pieces {
                Some(p) if !p.is_empty() => p
                    .iter()
                    .map(|s| self.new_stmt("simple", s, Vec::new()))
                    .collect(),
                _ => VecDeque::from([self.new_stmt("simple", &text, Vec::new())]),
            };
            self.push(f.raw, vec![Pending::Simple { stmts }]);
            return;
        }
        // Run each statement as Parse/Bind/Describe/Execute(max_rows)/…/Sync: one implicit
        // transaction and skip-on-error, like a simple query, but the backend stops at the cap.
        let error_mode = self.id.caps.mode == CapMode::Error;
        for piece in pieces.unwrap_or_default() {
            let mut stmt = self.new_stmt("simple", piece, Vec::new());
            let lower = error_mode || stmt.kind != Kind::Write;
            let max = if lower {
                self.id.caps.lowered(0).unwrap_or(0)
            } else {
                0
            };
            stmt.lowered = lower;
            let mut bytes = BytesMut::new();
            bytes.extend_from_slice(&frontend::build_parse(b"", piece.as_bytes()));
            bytes.extend_from_slice(&frontend::build_bind(b"", b""));
            bytes.extend_from_slice(&frontend::build_target(b'D', b'P', b""));
            bytes.extend_from_slice(&frontend::build_execute(b"", max));
            self.push(
                bytes.freeze(),
                vec![
                    Pending::Parse { swallow: true },
                    Pending::Bind { swallow: true },
                    Pending::Describe {
                        swallow_nodata: true,
                    },
                    Pending::Execute {
                        stmt,
                        barrier: error_mode && lower,
                    },
                ],
            );
        }
        self.push(frontend::build_sync(), vec![Pending::Sync]);
    }

    fn on_execute(&mut self, f: Frame) {
        let Some((portal, asked)) = frontend::execute(f.body()) else {
            self.push(f.raw, Vec::new());
            return;
        };
        let (text, params) = match self.portals.get(portal) {
            Some(p) => (p.text.clone(), p.params.clone()),
            None => (Arc::from(""), Vec::new()),
        };
        let mut stmt = self.new_stmt("extended", &text, params);
        if self.denies(stmt.kind) {
            // The refusal is raised by the backend in place of this Execute (the rest of the
            // pipeline is then skipped up to Sync, as after any error).
            stmt.denied = true;
            metrics::counter!("sandpit_denied_statements_total", "kind" => stmt.kind.as_str())
                .increment(1);
            let mut bytes = BytesMut::new();
            bytes.extend_from_slice(&frontend::build_parse(b"", DENY_SQL.as_bytes()));
            bytes.extend_from_slice(&frontend::build_bind(b"", b""));
            bytes.extend_from_slice(&frontend::build_execute(b"", 0));
            self.push(
                bytes.freeze(),
                vec![
                    Pending::Parse { swallow: true },
                    Pending::Bind { swallow: true },
                    Pending::Execute {
                        stmt,
                        barrier: false,
                    },
                ],
            );
            return;
        }
        let error_mode = self.id.caps.mode == CapMode::Error;
        let lowered = if error_mode || stmt.kind != Kind::Write {
            self.id.caps.lowered(asked)
        } else {
            None
        };
        match lowered {
            Some(max) => {
                stmt.lowered = true;
                let mut bytes = BytesMut::new();
                bytes.extend_from_slice(&frontend::build_execute(portal, max));
                let mut pending = vec![Pending::Execute {
                    stmt,
                    barrier: error_mode,
                }];
                if !portal.is_empty() {
                    // A cut portal is finished as far as the client knows: close it.
                    bytes.extend_from_slice(&frontend::build_target(b'C', b'P', portal));
                    pending.push(Pending::Close { swallow: true });
                }
                self.push(bytes.freeze(), pending);
            }
            None => self.push(
                f.raw,
                vec![Pending::Execute {
                    stmt,
                    barrier: false,
                }],
            ),
        }
    }
}

/// A named entry that would go past MAX_TRACKED entries or MAX_TRACKED_BYTES (the unnamed
/// one is always allowed: it replaces itself and is bounded by the message size).
fn over_limit<V>(map: &HashMap<Vec<u8>, V>, name: &[u8], bytes_after: usize) -> bool {
    !name.is_empty()
        && ((map.len() >= MAX_TRACKED && !map.contains_key(name))
            || bytes_after > MAX_TRACKED_BYTES)
}

/// Bytes a tracked portal holds (its text is shared with the prepared statement).
fn portal_size(name: &[u8], p: &Portal) -> usize {
    name.len()
        + p.params
            .iter()
            .map(|v| v.as_ref().map_or(0, String::len))
            .sum::<usize>()
}
