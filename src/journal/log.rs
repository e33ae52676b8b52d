//! The statement log format: one JSON object per line, one file per token under
//! `<data dir>/logs/<task>/<token id>.jsonl`. A `statement` record is appended before the
//! statement is forwarded, an `outcome` record (same `seq`) after it completed, so a
//! statement that ran is never missing even if the gateway dies mid-statement. The relay
//! defers outcome records ([`TokenLog::defer_outcome`]): they go out in the same `write(2)`
//! as the next statement record, or when the session goes idle or ends, so a statement costs
//! one write rather than two; a SIGKILL can lose only outcomes not yet written.
//!
//! Each token's log has a quota (`log.max_bytes_per_token`) and statement text past
//! [`TEXT_MAX`] is stored cut with its length and SHA-256, so an agent cannot fill the disk
//! through its log nor run statements unlogged by filling it: a record that cannot be
//! written refuses its statement. Readers (`read`) stream the file, a page at a time.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

mod book;
mod compact;
mod defs;
mod fill;
mod intern;
mod line;
mod mapped;
mod merge;
mod open;
mod others;
mod place;
mod read;
mod record;

use fill::fill_level;
pub use fill::FILL_WARNINGS;

pub use book::{LogBook, SyncTicker, OUTCOME_IDLE, SYNC_INTERVAL};
pub use line::{param_text, to_line, OutcomeRef, StatementRef};
pub use place::{is_front_id, FrontFile, LogFiles, LogPlace};
pub use read::{read_page, read_statements, scan, statement_at, unreadable_lines, LogEntry, Page};
pub use record::{
    settled_kind, LogRecord, LoggedStatement, OutcomeRecord, StatementRecord, TextCut,
};

/// Errors writing or reading a log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("statement log {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The record would take the token's log past `log.max_bytes_per_token`.
    #[error("statement log {path} is full (log.max_bytes_per_token = {max})")]
    Quota { path: PathBuf, max: u64 },
}

/// Statement text longer than this (bytes) is stored cut, with its length and SHA-256.
pub const TEXT_MAX: usize = 64 * 1024;
/// Default of `log.max_bytes_per_token`.
pub const DEFAULT_MAX_BYTES_PER_TOKEN: u64 = 256 * 1024 * 1024;
/// Deferred outcome records are written at once when this many bytes of them are waiting.
const PENDING_MAX: usize = 64 * 1024;
/// A log with at least this many writes in one [`OUTCOME_IDLE`] tick (about 200 a second)
/// is busy: its records are copied into a mapping of the file from then on (see `mapped`),
/// until a tick passes with none.
const BUSY_WRITES: u64 = 16;
/// How long a statement record waits for the records of lower sequence numbers (taken a
/// moment earlier by another thread) before it is written out of order.
const TURN_WAIT: Duration = Duration::from_secs(1);

/// The file side of a [`TokenLog`], under its lock.
struct Writer {
    /// Shared with [`TokenLog::sync`], which syncs it without taking the lock.
    file: Arc<std::fs::File>,
    /// Bytes in the file (every record counted when its write returned).
    len: u64,
    /// The file may end in part of a record (a write that failed and could not be undone):
    /// the next record starts on a new line.
    torn: bool,
    /// Highest statement `seq` whose append has finished: records are written in `seq`
    /// order, so readers can page by `seq` (see `read::start_offset`).
    turn: u64,
    /// Appends waiting for their turn.
    waiters: usize,
    /// The line being written (reused: no allocation per record).
    line: Vec<u8>,
    /// Outcome records deferred ([`TokenLog::defer_outcome`]), formatted, not yet written:
    /// they lead the next write.
    pending: Vec<u8>,
    /// Writes that carried deferred outcomes so far, and the count the idle ticker saw
    /// with outcomes waiting: if it sees the same count again, nothing was written for a
    /// whole tick and it writes them (see [`TokenLog::flush_idle_outcomes`]).
    carried: u64,
    seen: Option<u64>,
    /// Parts of the last records kept formatted (text, token and task, date and time).
    escaped: line::EscapeCache,
    /// Set for a version 2 log (compact records, see `compact`); None: JSON lines only
    /// (a log begun by an earlier version goes on as it began).
    intern: Option<intern::Interner>,
    /// Set while the log is busy: records are copied into this mapping of the file's
    /// reserved tail instead of written (the file is then longer than `len`).
    tail: Option<mapped::MappedTail>,
    /// Writes so far, and the count at the last tick (see [`TokenLog::adapt`]).
    writes: u64,
    writes_at_tick: u64,
    /// Bytes of the other fronts' files of this token (shared directory only) when last
    /// summed, and the length of this file at which they are summed again (see `others`).
    others: u64,
    resum_at: u64,
}

/// An open, append-only log of one token. Each record is one `write(2)` of one line on an
/// O_APPEND file, done before the statement is forwarded: once `append` returns, the record
/// survives a SIGKILL of the gateway (it is in the kernel). `sync` makes it survive a
/// machine crash; the log book runs it every second and when the token ends.
pub struct TokenLog {
    path: PathBuf,
    /// The writer's file, for `sync`: an fsync under the writer's lock would block every
    /// append of the token (and the thread it runs on) for the length of the sync.
    synced: Arc<std::fs::File>,
    writer: Mutex<Writer>,
    turns: Condvar,
    seq: AtomicU64,
    dirty: AtomicBool,
    max_bytes: u64,
    /// Under a shared directory: the token's directory of front files, whose other files
    /// count towards the quota too (see `others`).
    siblings: Option<PathBuf>,
    /// The highest warning level reached (see [`FILL_WARNINGS`]; 0: none): a session tells
    /// its client when it sees a level it has not told yet.
    fill: std::sync::atomic::AtomicU8,
}

impl TokenLog {
    /// The next statement sequence number.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Append one record as one line. A statement record is refused (`LogError::Quota`) when
    /// it would take the file past the token's quota; outcome records are always written
    /// (each belongs to a statement already logged). A write that fails is undone
    /// (truncated away), so a full disk leaves no cut-off record behind.
    pub fn append(&self, rec: &LogRecord) -> Result<(), LogError> {
        match rec {
            LogRecord::Statement(s) => self.append_statement(&line::statement_ref(s)),
            LogRecord::Outcome(o) => self.append_outcome(&line::outcome_ref(o)),
        }
    }

    /// Append a statement record under the next `seq`, taken under the writer's lock, and
    /// return that `seq`: no wait for another thread's lower number (which
    /// [`TokenLog::append_statement`] may do, blocking its thread meanwhile). `s.seq` is
    /// ignored. The relay's way to log.
    pub fn append_next_statement(&self, mut s: StatementRef<'_>) -> Result<u64, LogError> {
        let w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        s.seq = self.next_seq();
        self.write_statement(w, &s).map(|()| s.seq)
    }

    /// Append a statement record (see [`TokenLog::append`]); its `seq` from [`TokenLog::next_seq`].
    pub fn append_statement(&self, s: &StatementRef<'_>) -> Result<(), LogError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if s.seq > w.turn + 1 {
            // Lower numbers were taken a moment ago by other threads that are about to
            // append; a number that is never appended delays this one by TURN_WAIT at most.
            w.waiters += 1;
            w = self
                .turns
                .wait_timeout_while(w, TURN_WAIT, |w| s.seq > w.turn + 1)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
            w.waiters -= 1;
        }
        self.write_statement(w, s)
    }

    /// Write statement record `s` (its turn has come), then wake the appends waiting for it.
    fn write_statement(
        &self,
        mut w: std::sync::MutexGuard<'_, Writer>,
        s: &StatementRef<'_>,
    ) -> Result<(), LogError> {
        let w_ = &mut *w;
        start_line(w_);
        let outcomes = w_.line.len();
        let at = w_.len;
        let compact = match w_.intern.as_mut() {
            Some(i) => i.statement(&mut w_.line, at, s),
            None => false,
        };
        if !compact {
            line::statement_line(&mut w_.line, s, &mut w_.escaped);
        }
        if w_.len >= w_.resum_at {
            others::resum(w_, self.siblings.as_deref(), &self.path, self.max_bytes);
        }
        let total = w_.others + w_.len;
        let result = if self.max_bytes > 0 && total + w_.line.len() as u64 > self.max_bytes {
            metrics::counter!("sandpit_log_quota_exceeded_total").increment(1);
            // The deferred outcomes are written all the same (outcomes are never refused).
            w_.line.truncate(outcomes);
            forget_definitions(w_);
            let written = if w_.pending.is_empty() {
                Ok(())
            } else {
                self.write_line(w_)
            };
            written.and(Err(LogError::Quota {
                path: self.path.clone(),
                max: self.max_bytes,
            }))
        } else {
            self.write_line(w_)
        };
        if matches!(result, Err(LogError::Io { .. })) {
            forget_definitions(w_);
        }
        if !matches!(result, Err(LogError::Io { .. })) && !w_.pending.is_empty() {
            // Written (or refused after they were): they no longer wait.
            w_.pending.clear();
            w_.carried += 1;
        }
        w.turn = w.turn.max(s.seq);
        // A notify is a futex call each time: only when someone waits (they register
        // under the same lock, so none is missed).
        let wake = w.waiters > 0;
        drop(w);
        if wake {
            self.turns.notify_all();
        }
        result
    }

    /// Append an outcome record now (see [`TokenLog::append`]); deferred outcomes go first.
    pub fn append_outcome(&self, o: &OutcomeRef<'_>) -> Result<(), LogError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        put_outcome(&mut w, o);
        self.flush_locked(&mut w)
    }

    /// Keep an outcome record to be written with the next statement record (in the same
    /// `write(2)`), or by [`TokenLog::flush_outcomes`], whichever comes first; written at once
    /// when [`PENDING_MAX`] bytes of them wait. Until written, a SIGKILL of the gateway loses
    /// it: its statement then reads as never completed.
    pub fn defer_outcome(&self, o: &OutcomeRef<'_>) -> Result<(), LogError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // One that defined a text is written at once: a definition's offset holds only
        // while nothing else is written first.
        if put_outcome(&mut w, o) || w.pending.len() >= PENDING_MAX {
            return self.flush_locked(&mut w);
        }
        Ok(())
    }

    /// Write the deferred outcome records, if any (one `write(2)`).
    pub fn flush_outcomes(&self) -> Result<(), LogError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if w.pending.is_empty() {
            return Ok(());
        }
        self.flush_locked(&mut w)
    }

    fn flush_locked(&self, w: &mut Writer) -> Result<(), LogError> {
        start_line(w);
        let result = self.write_line(w);
        if result.is_ok() {
            w.pending.clear();
            w.carried += 1;
        } else {
            forget_definitions(w);
        }
        result
    }

    /// Write the deferred outcomes if they already waited at the previous call with no
    /// write since (the token's sessions went idle); called every [`OUTCOME_IDLE`]. A busy
    /// session's outcomes ride with its statement records and are never written here.
    pub fn flush_idle_outcomes(&self) -> Result<(), LogError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if w.pending.is_empty() {
            w.seen = None;
            return Ok(());
        }
        if w.seen != Some(w.carried) {
            w.seen = Some(w.carried);
            return Ok(());
        }
        self.flush_locked(&mut w)
    }

    /// Writes `w.line`: copied into the mapped tail when the log is busy, else one `write(2)`.
    fn write_line(&self, w: &mut Writer) -> Result<(), LogError> {
        if let Some(tail) = w.tail.as_mut() {
            match tail.append(&w.file, w.len, &w.line, self.max_bytes) {
                Ok(()) => {
                    self.written(w);
                    return Ok(());
                }
                // No room to reserve more (a full disk): back to a plain file, and the
                // write below says whether the record itself still fits.
                Err(e) => {
                    tracing::debug!(error = %e, path = %self.path.display(), "statement log: mapping not grown");
                    if let Err(source) = self.release_locked(w) {
                        return Err(LogError::Io {
                            path: self.path.clone(),
                            source,
                        });
                    }
                }
            }
        }
        match (&*w.file).write_all(&w.line) {
            Ok(()) => {
                self.written(w);
                Ok(())
            }
            Err(source) => {
                // Shrinking needs no free space: undo whatever part of the line got in.
                let len = w.len;
                if w.file.set_len(len).is_err() {
                    w.torn = true;
                    if let Ok(m) = w.file.metadata() {
                        w.len = m.len();
                    }
                }
                Err(LogError::Io {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    fn written(&self, w: &mut Writer) {
        w.len += w.line.len() as u64;
        w.torn = false;
        w.writes += 1;
        self.dirty.store(true, Ordering::Release);
        if self.max_bytes > 0 {
            self.note_fill(w.others + w.len);
        }
    }

    /// Raise the warning level when `len` crossed one (once per level and log).
    fn note_fill(&self, len: u64) {
        let Some(level) = fill_level(len, self.max_bytes) else {
            return;
        };
        if self.fill.fetch_max(level, Ordering::AcqRel) < level {
            metrics::counter!("sandpit_log_fill_warnings_total").increment(1);
            tracing::warn!(path = %self.path.display(), percent = level, max_bytes = self.max_bytes,
                "statement log is filling up: statements are refused (58030) once it reaches log.max_bytes_per_token");
        }
    }

    /// The highest of [`FILL_WARNINGS`] this log has reached (0: none).
    pub fn fill_warning(&self) -> u8 {
        self.fill.load(Ordering::Relaxed)
    }

    /// The quota (0: none).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Back to a plain file: unmaps the tail and cuts its reservation off.
    fn release_locked(&self, w: &mut Writer) -> std::io::Result<()> {
        match w.tail.take() {
            Some(tail) => tail.release(&w.file, w.len),
            None => Ok(()),
        }
    }

    /// Called every [`OUTCOME_IDLE`]: a log written [`BUSY_WRITES`] times or more since the
    /// last call is mapped (a record then costs no syscall); a mapped log not written since
    /// is released, so an idle log is a plain file with no reserved tail.
    pub fn adapt(&self) {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let recent = w.writes - w.writes_at_tick;
        w.writes_at_tick = w.writes;
        let w_ = &mut *w;
        if w_.tail.is_none() && recent >= BUSY_WRITES {
            match mapped::MappedTail::start(&w_.file, w_.len, 0, self.max_bytes) {
                Ok(tail) => w_.tail = Some(tail),
                // Not everywhere (a file system without fallocate): stays a plain file.
                Err(e) => tracing::debug!(error = %e, "statement log: not mapped"),
            }
        } else if w_.tail.is_some() && recent == 0 {
            if let Err(e) = self.release_locked(w_) {
                tracing::warn!(error = %e, path = %self.path.display(), "statement log: reservation not cut");
            }
        }
    }

    /// Releases the mapped tail, if any (token ended, or the gateway stops).
    pub fn release(&self) {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = self.release_locked(&mut w) {
            tracing::warn!(error = %e, path = %self.path.display(), "statement log: reservation not cut");
        }
    }

    /// Bytes of records in the file (without a mapped log's reserved tail).
    pub fn data_len(&self) -> u64 {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).len
    }

    /// Whether records are being copied into a mapping (the log is busy).
    pub fn is_mapped(&self) -> bool {
        self.writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tail
            .is_some()
    }

    /// Write the deferred outcomes, then fsync if anything was written since the last sync.
    pub fn sync(&self) -> Result<(), LogError> {
        // What was written is synced even when the deferred outcomes could not be.
        let flushed = self.flush_outcomes();
        if self.dirty.swap(false, Ordering::AcqRel) {
            // Outside the lock: what was written before the swap is covered (the sync is of
            // the file, mapped tail included); a write racing it sets `dirty` again.
            self.synced.sync_data().map_err(|source| LogError::Io {
                path: self.path.clone(),
                source,
            })?;
        }
        flushed
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TokenLog {
    fn drop(&mut self) {
        if let Err(e) = self.flush_outcomes() {
            tracing::error!(error = %e, "statement log: deferred outcomes lost");
        }
        self.release();
    }
}

/// Start `w.line` for a write: a newline first when the file ends in part of a record, then
/// the deferred outcome records.
fn start_line(w: &mut Writer) {
    w.line.clear();
    if w.torn {
        w.line.push(b'\n');
    }
    w.line.extend_from_slice(&w.pending);
}

/// Formats an outcome record into the deferred ones: compact when the log is version 2 and
/// it can be. True when it carries a definition.
fn put_outcome(w: &mut Writer, o: &OutcomeRef<'_>) -> bool {
    // Deferred records land after the newline a torn file gets first (see `start_line`).
    let at = w.len + u64::from(w.torn);
    match w
        .intern
        .as_mut()
        .and_then(|i| i.outcome(&mut w.pending, at, o))
    {
        Some(defined) => defined,
        None => {
            line::outcome_line(&mut w.pending, o, &mut w.escaped);
            false
        }
    }
}

/// After a write that was refused or failed: the definitions it carried may not be in the
/// file, so none is referred to again (each is defined anew at its next use).
fn forget_definitions(w: &mut Writer) {
    if let Some(i) = w.intern.as_mut() {
        i.forget();
    }
}

/// Path of a token's log.
pub fn log_path(data_dir: &Path, task: &str, token: &str) -> PathBuf {
    data_dir
        .join("logs")
        .join(task)
        .join(format!("{token}.jsonl"))
}
