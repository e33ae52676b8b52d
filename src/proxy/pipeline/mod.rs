//! The relay's view of the protocol: every client message is logged and turned into what
//! goes to the backend, together with the responses it will cause (a FIFO, as PgDog keeps);
//! every backend message is matched against that FIFO so results can be capped, statement
//! outcomes logged, and the client still sees a correct sequence of tags and transaction
//! states. Messages the gateway does not change are passed on as the bytes that were read.
//!
//! What holds even when the gateway misreads the client's SQL: every result is counted and
//! capped from the backend's own stream (a result nobody expected is counted as a stray);
//! a prepared statement or portal is bound to its text only once the server accepted it
//! ([`names`]); and the bookkeeping per message is O(1) (barrier count, bounded FIFO).

mod chatter;
mod client;
mod fifo;
mod log;
mod named;
mod names;
mod outbox;
mod owned;
mod policy;
mod responses;
mod shown_names;
mod sql_names;
#[cfg(test)]
mod tests;

use chatter::{Chatter, Noise};
use fifo::Fifo;
use names::{Names, Weight};
use outbox::Outbox;
use owned::BackendNames;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::caps::{CapPolicy, ResultCount};
use crate::journal::classify::Kind;
use crate::journal::log::TokenLog;
use crate::wire::frame::Frame;

/// Most named prepared statements / portals a session may keep (bounds gateway memory); one
/// more is refused with SQLSTATE 53400.
pub const MAX_TRACKED: usize = 10_000;
/// Most bytes of statement text and logged parameters those may hold per session (the
/// count alone would let 10 000 huge statements pile up in the gateway).
pub const MAX_TRACKED_BYTES: usize = 32 * 1024 * 1024;
/// Most responses a session may have outstanding: past it the relay stops reading the
/// client until the backend catches up (memory per session stays bounded).
pub const MAX_PENDING: usize = 16_384;
/// Most statements of one simple Query the gateway runs one by one (so the backend stops at
/// the row cap); a longer Query is relayed whole, logged as one record, and still capped
/// result by result from the backend's stream.
pub const MAX_SPLIT_STATEMENTS: usize = crate::journal::classify::MAX_STATEMENTS;
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
    /// The result arriving now.
    count: ResultCount,
    /// Rows held back in error mode until the result is known to fit.
    held: Vec<Bytes>,
    /// Rows past the row cap of a statement the backend runs to its end, held (within the
    /// byte cap) until its tag says whether they are a write's RETURNING rows (all owed)
    /// or a read's (dropped).
    beyond: Vec<Bytes>,
    /// For an Execute: the portal and the client's Bind count when it was sent, so a
    /// RowDescription from a Describe of the very same portal can be matched to it.
    portal_key: Option<(Vec<u8>, u64)>,
    /// For an Execute: the `Prepared::id` its portal was bound from.
    statement_id: Option<u64>,
    copy_out: bool,
    /// Lowered Execute.max_rows: the backend stops at cap + 1.
    lowered: bool,
    /// FETCH / SELECT for the tag of a cut result.
    verb: &'static str,
    /// Refused by the seatbelt policy.
    denied: bool,
    /// Results finished so far (a text the splitter could not split may bring several).
    results: u32,
    /// Rows passed on over all its results.
    total_rows: u64,
    /// Some result of it was cut.
    capped: bool,
    /// The tag the client saw for its last result.
    last_tag: Option<String>,
    /// Client COPY ends (CopyDone/CopyFail) sent before this statement: a COPY FROM STDIN
    /// it starts lasts until the next one.
    copy_ends_before: u64,
    /// A FunctionCall: its one result is a FunctionCallResponse.
    function: bool,
    /// Its statement record could not be written: it must not run.
    unlogged: bool,
    /// The strongest kind its results' command tags told so far (see `tag_kind`).
    told: Option<Kind>,
    /// A result's tag did not tell a kind: the text's kind stays a guess.
    untold: bool,
    /// The result arriving now was described (a RowDescription): a read's `SELECT n`.
    described: bool,
}

impl Stmt {
    fn refused_by_log(&self) -> bool {
        self.unlogged
    }
}

/// A change to a prepared statement or portal name, confirmed by the server's answer.
enum Change {
    Stmt(Vec<u8>),
    Portal(Vec<u8>),
}

enum Pending {
    Parse {
        swallow: bool,
        change: Option<Change>,
    },
    Bind {
        swallow: bool,
        change: Option<Change>,
    },
    Describe {
        swallow_nodata: bool,
        /// For a portal Describe: the portal and the Bind count (see `Stmt::portal_key`).
        portal_key: Option<(Vec<u8>, u64)>,
        /// For a statement Describe: the statement's name and `Prepared::id`.
        statement: Option<(Vec<u8>, u64)>,
    },
    Execute {
        /// Boxed: a statement's state is large, and entries move through the outbox and
        /// the FIFO (moving a pointer, not the state). The boxes are reused (see
        /// `Pipeline::spare`).
        stmt: Box<Stmt>,
        barrier: bool,
    },
    /// The statement the gateway injected to fail a capped result in error mode.
    InjectedError,
    /// A Parse or Bind over MAX_TRACKED, replaced by a failing Parse.
    Refused,
    Close {
        swallow: bool,
        change: Option<Change>,
    },
    Sync {
        /// Client COPY ends sent before it (see `Stmt::copy_ends_before`).
        copy_ends_before: u64,
    },
    /// A simple Query (or FunctionCall) relayed as is: responses until ReadyForQuery. Its
    /// last statement stays at the front until then, so results beyond what the splitter
    /// found are still counted and capped.
    Simple { stmts: VecDeque<Stmt> },
    /// A simple Query or FunctionCall replaced by a refusal raised in the backend: an error,
    /// then ReadyForQuery.
    Denied { code: &'static str, message: String },
}

impl Pending {
    fn is_barrier(&self) -> bool {
        matches!(self, Pending::Execute { barrier: true, .. })
    }
}

/// Sync, shared (no allocation per use).
fn sync_message() -> Bytes {
    Bytes::from_static(b"S\0\0\0\x04")
}

/// Flush.
const FLUSH: &[u8] = b"H\0\0\0\x04";

/// Statement boxes (and statement queue slots) a session keeps for reuse.
const KEEP_SPARE: usize = 8;

/// A prepared statement: its text, and whether a Describe showed that its result has only
/// catalog columns (a driver's own catalog query, not cut by the row cap).
#[derive(Clone)]
struct Prepared {
    text: Arc<str>,
    catalog: bool,
    /// Drawn per Parse, so a Describe's answer is matched to the very statement it
    /// described (and to the portals bound from it) even when the name is reused.
    id: u64,
    /// Its text's kind and whether the text may read catalogs, found once at Parse (not
    /// again at every Execute of it).
    kind: Kind,
    may_read_catalogs: bool,
    /// The backend's name for it (see [`owned`]; 0: the unnamed statement).
    backend: u64,
}

impl Weight for Prepared {
    fn weight(&self) -> usize {
        self.text.len()
    }
}

/// Keeps the parameter list of a portal that is gone, emptied, for the next Bind (unless
/// one is kept already, or it is large).
fn keep_params(spare: &mut Vec<Option<String>>, old: Portal) {
    let mut params = old.params;
    if spare.capacity() == 0 && params.capacity() <= MAX_SPARE_PARAMS {
        params.clear();
        *spare = params;
    }
}

/// The longest parameter list kept for reuse.
const MAX_SPARE_PARAMS: usize = 64;

/// A bound portal: the text its statement had when the Bind was sent, and its parameters.
#[derive(Clone)]
struct Portal {
    text: Arc<str>,
    params: Vec<Option<String>>,
    catalog: bool,
    /// The `Prepared::id` it was bound from.
    statement_id: u64,
    /// Its statement's `Prepared::kind` and `Prepared::may_read_catalogs`.
    kind: Kind,
    may_read_catalogs: bool,
    /// The backend's name for it (see [`owned`]; 0: the unnamed portal).
    backend: u64,
}

impl Weight for Portal {
    // Its text is shared with the prepared statement.
    fn weight(&self) -> usize {
        self.params
            .iter()
            .map(|v| v.as_ref().map_or(0, String::len))
            .sum()
    }
}

/// Protocol state of one relayed session.
pub struct Pipeline {
    id: SessionIdentity,
    fifo: Fifo,
    outbox: Outbox,
    /// Boxes of finished statements, reused for the next ones (no allocation per
    /// statement); at most `KEEP_SPARE`. Boxes, not statements: they move into
    /// `Pending::Execute` as they are.
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Stmt>>,
    /// An empty statement queue with its capacity, reused for the next simple Query.
    spare_stmts: VecDeque<Stmt>,
    /// An empty parameter list with its capacity (from a portal the server replaced or
    /// dropped), reused for the next Bind.
    spare_params: Vec<Option<String>>,
    /// A simple Query's statement ranges, reused (see `classify::split_ranges`).
    spare_ranges: Vec<std::ops::Range<usize>>,
    prepared: Names<Prepared>,
    portals: Names<Portal>,
    /// The backend's names for the client's named statements and portals.
    backend_names: BackendNames,
    /// Client Syncs, Queries and FunctionCalls so far: the group a message belongs to.
    group: u64,
    /// Client messages waiting for an answer they depend on (see `names`), in order.
    held: VecDeque<Frame>,
    /// The unnamed statement (and portal) may hold the gateway's own text (rewritten
    /// queries, refusals) where the client expects them gone: closed before the client
    /// next relies on them.
    stmt_dirty: bool,
    portal_dirty: bool,
    /// Binds sent so far (the client's and the gateway's own).
    binds: u64,
    /// Parses proposed so far (the source of `Prepared::id`).
    parses: u64,
    /// Client COPY ends (CopyDone, CopyFail) so far.
    copy_ends: u64,
    /// A COPY FROM STDIN runs until the client's COPY end number `n + 1`; Syncs before it
    /// are ignored by the server.
    copy_in_until: Option<u64>,
    /// Client Syncs the server ignored inside COPY FROM STDIN, not yet reported.
    ignored_syncs: u64,
    /// Counts a result that arrived with no statement expecting it.
    stray: Option<Stmt>,
    /// Transaction status from the last ReadyForQuery.
    pub tx_status: u8,
    /// An extended-protocol error happened and its Sync has not been forwarded yet: the
    /// server answers nothing until then, so nothing is expected either.
    skip_until_sync: bool,
    /// Outcome records were deferred since this session's last statement record (see
    /// `TokenLog::defer_outcome`): written when the session ends.
    deferred: std::cell::Cell<bool>,
    /// The text of the last Parse with its kind and catalog guess: a driver that parses the
    /// same text again (the unnamed statement, each time) shares it, not classified again.
    last_parsed: Option<(Arc<str>, Kind, bool)>,
    /// Notices and notifications of the current stretch, counted against `max_bytes`.
    chatter: Chatter,
    /// The statement log's fill warning this session last told its client (see
    /// `journal::log::FILL_WARNINGS`).
    log_warned: u8,
    /// The session's span, entered around the pipeline's own events (the relay does not
    /// run inside it: see `proxy::session::handle`).
    span: tracing::Span,
}

impl Pipeline {
    /// New state for a session that just got its first ReadyForQuery.
    pub fn new(id: SessionIdentity) -> Pipeline {
        Pipeline {
            id,
            fifo: Fifo::default(),
            outbox: Outbox::default(),
            spare: Vec::new(),
            spare_stmts: VecDeque::new(),
            spare_params: Vec::new(),
            spare_ranges: Vec::new(),
            prepared: Names::new(),
            portals: Names::new(),
            backend_names: BackendNames::new(),
            group: 0,
            held: VecDeque::new(),
            stmt_dirty: false,
            portal_dirty: false,
            binds: 0,
            parses: 0,
            copy_ends: 0,
            copy_in_until: None,
            ignored_syncs: 0,
            stray: None,
            tx_status: b'I',
            skip_until_sync: false,
            deferred: std::cell::Cell::new(false),
            last_parsed: None,
            chatter: Chatter::default(),
            log_warned: 0,
            span: tracing::Span::none(),
        }
    }

    /// The session's span for the pipeline's events (none by default).
    pub fn in_span(mut self, span: tracing::Span) -> Pipeline {
        self.span = span;
        self
    }

    /// Whether forwarding must wait for an earlier result (error mode needs to know whether
    /// a result fits before anything after it reaches the backend).
    pub fn blocked(&self) -> bool {
        self.fifo.barriers() > 0
    }

    /// Whether the relay may read more from the client: nothing is waiting to be sent or
    /// held, and the responses outstanding are within bounds.
    pub fn accepting(&self) -> bool {
        self.outbox.is_empty() && self.held.is_empty() && self.fifo.len() < MAX_PENDING
    }

    /// Client Syncs the server ignored (inside COPY FROM STDIN) since the last call: they
    /// will get no ReadyForQuery.
    pub fn take_ignored_syncs(&mut self) -> u64 {
        std::mem::take(&mut self.ignored_syncs)
    }

    /// Move what may be sent now into `to_backend`.
    pub fn drain_outbox(&mut self, to_backend: &mut BytesMut) {
        loop {
            self.drain_ready(to_backend);
            // Skipped messages may have settled a change a held message waits for.
            let held = self.held.len();
            if held == 0 {
                return;
            }
            self.release_held();
            if self.held.len() == held {
                return;
            }
        }
    }

    fn drain_ready(&mut self, to_backend: &mut BytesMut) {
        while !self.blocked() {
            let Some(taken) = self.outbox.take(to_backend) else {
                break;
            };
            if taken.barrier {
                // The backend only flushes at Sync or Flush; we hold the Sync back, so ask.
                to_backend.extend_from_slice(FLUSH);
            }
            for _ in 0..taken.responses {
                let Some(p) = self.outbox.pop_response() else {
                    break;
                };
                if !self.skip_until_sync {
                    self.fifo.push_back(p);
                    continue;
                }
                match p {
                    Pending::Sync { .. } => {
                        self.skip_until_sync = false;
                        self.fifo.push_back(p);
                    }
                    other => self.skipped(other),
                }
            }
        }
    }

    /// Nothing waits to be forwarded.
    pub fn outbox_empty(&self) -> bool {
        self.outbox.is_empty()
    }

    fn push(&mut self, bytes: Bytes, pending: impl IntoIterator<Item = Pending>) {
        self.outbox.push(bytes, pending);
    }

    /// `stmt` in a box of a finished statement when there is one.
    fn boxed(&mut self, stmt: Stmt) -> Box<Stmt> {
        match self.spare.pop() {
            Some(mut b) => {
                *b = stmt;
                b
            }
            None => Box::new(stmt),
        }
    }

    /// A finished statement's box, kept for the next one.
    fn recycle(&mut self, stmt: Box<Stmt>) {
        if self.spare.len() < KEEP_SPARE {
            self.spare.push(stmt);
        }
    }

    /// A simple Query's statement queue, emptied, kept for the next one (unless a long
    /// Query made it large).
    fn recycle_stmts(&mut self, mut stmts: VecDeque<Stmt>) {
        if stmts.capacity() <= KEEP_SPARE {
            stmts.clear();
            self.spare_stmts = stmts;
        }
    }

    /// An expected response that will never come (the server skipped its message): its
    /// statement is logged as skipped and its name change never happens.
    fn skipped(&mut self, p: Pending) {
        match p {
            Pending::Execute { stmt, .. } => self.log_outcome(&stmt, None, None, true),
            Pending::Simple { stmts } => {
                for s in stmts {
                    self.log_outcome(&s, None, None, true);
                }
            }
            Pending::Parse { change, .. }
            | Pending::Bind { change, .. }
            | Pending::Close { change, .. } => self.settle(change, false),
            _ => {}
        }
    }

    /// The server answered (or will never answer) a message that changes a name.
    fn settle(&mut self, change: Option<Change>, accepted: bool) {
        match (change, accepted) {
            (Some(Change::Stmt(n)), true) => drop(self.prepared.confirm(&n)),
            (Some(Change::Stmt(n)), false) => self.prepared.discard(&n),
            (Some(Change::Portal(n)), true) => {
                if let Some(old) = self.portals.confirm(&n) {
                    keep_params(&mut self.spare_params, old);
                }
            }
            (Some(Change::Portal(n)), false) => self.portals.discard(&n),
            (None, _) => {}
        }
    }
}
