//! Reading a statement log without loading it: lines through a bounded buffer, a page of
//! statements at a time. Statement records are written in `seq` order (see
//! `TokenLog::append`), so the start of a page is found by bisecting the file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;

use super::defs::{self, Defs};
use super::{compact, LogError, LoggedStatement, OutcomeRecord, StatementRecord, TextCut};

/// Lines longer than this are skipped (the gateway never writes one: text is cut to 64 KiB
/// and each bind parameter to 256 bytes).
const LINE_MAX: usize = 32 << 20;
/// A page stops early once its statements hold this many bytes of text and parameters
/// (it always holds at least one).
pub const PAGE_BYTES_MAX: usize = 16 << 20;
/// Below this many bytes the bisection stops and the scan goes on line by line.
const BISECT_MIN: u64 = 64 << 10;

/// One record of a log, in file order.
#[derive(Debug)]
pub enum LogEntry {
    /// A statement record, at byte `offset` of the file.
    Statement {
        /// Where its line starts (for [`statement_at`]).
        offset: u64,
        /// The record.
        statement: StatementRecord,
        /// Set when its text was stored cut.
        cut: Option<TextCut>,
    },
    /// An outcome record.
    Outcome(OutcomeRecord),
}

/// Statements of a log with their outcomes, in `seq` order.
#[derive(Debug, Default)]
pub struct Page {
    /// The statements.
    pub statements: Vec<LoggedStatement>,
    /// The `after` of the next page, when more statements may follow.
    pub next_after: Option<u64>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Stored {
    Statement(StoredStatement),
    Outcome(OutcomeRecord),
}

#[derive(Deserialize)]
struct StoredStatement {
    #[serde(flatten)]
    statement: StatementRecord,
    #[serde(flatten)]
    cut: Option<TextCut>,
}

/// What a line is, read without parsing all of it.
#[derive(Debug, PartialEq)]
enum Head {
    Statement(u64),
    Outcome(u64),
    Other,
}

/// What a line is; a compact record (format version 2) only when it ended in its newline.
fn head(line: &[u8], complete: bool) -> Head {
    match line.first() {
        Some(&b'{') => json_head(line),
        _ if !complete => Head::Other,
        _ => match compact::head(line) {
            Some((compact::STATEMENT, seq)) => Head::Statement(seq),
            Some((_, seq)) => Head::Outcome(seq),
            None => Head::Other,
        },
    }
}

/// The record a line holds (a JSON line, or a compact one expanded through `defs`).
fn stored(defs: &mut Defs, line: &[u8]) -> Option<Stored> {
    match line.first()? {
        b'{' => serde_json::from_slice(line).ok(),
        &compact::STATEMENT | &compact::INLINE => {
            let (statement, cut) = defs.statement(line)?;
            Some(Stored::Statement(StoredStatement { statement, cut }))
        }
        _ => defs.outcome(line).map(Stored::Outcome),
    }
}

fn json_head(line: &[u8]) -> Head {
    const STATEMENT: &[u8] = b"{\"type\":\"statement\",\"seq\":";
    const OUTCOME: &[u8] = b"{\"type\":\"outcome\",\"seq\":";
    let (rest, statement) = if let Some(r) = line.strip_prefix(STATEMENT) {
        (r, true)
    } else if let Some(r) = line.strip_prefix(OUTCOME) {
        (r, false)
    } else if defs::is_meta(line) {
        return Head::Other;
    } else {
        return head_slow(line);
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // A line cut short by a crash has no closing brace: it is not a record.
    if digits == 0 || digits > 19 || rest.get(digits) != Some(&b',') || line.last() != Some(&b'}') {
        return Head::Other;
    }
    let seq = std::str::from_utf8(&rest[..digits])
        .ok()
        .and_then(|d| d.parse().ok());
    match (seq, statement) {
        (Some(s), true) => Head::Statement(s),
        (Some(s), false) => Head::Outcome(s),
        (None, _) => Head::Other,
    }
}

/// [`head`] of a line whose keys are in another order (written by another tool): parsed.
fn head_slow(line: &[u8]) -> Head {
    #[derive(Deserialize)]
    struct AnyRecord {
        #[serde(rename = "type")]
        kind: String,
        seq: u64,
    }
    match serde_json::from_slice::<AnyRecord>(line) {
        Ok(r) if r.kind == "statement" => Head::Statement(r.seq),
        Ok(r) if r.kind == "outcome" => Head::Outcome(r.seq),
        _ => Head::Other,
    }
}

/// Lines of a file from some offset, through a bounded buffer.
struct Lines {
    r: BufReader<File>,
    pos: u64,
    /// Whether the last line read ended in its newline (else the file ended, or a zero
    /// byte: a record cut or still being copied in).
    complete: bool,
}

impl Lines {
    fn at(file: File, pos: u64) -> std::io::Result<Lines> {
        let mut r = BufReader::with_capacity(64 << 10, file);
        r.seek(SeekFrom::Start(pos))?;
        Ok(Lines {
            r,
            pos,
            complete: false,
        })
    }

    /// The next line (without its newline) into `buf`, and where it starts; None at the
    /// end. A line longer than [`LINE_MAX`] comes back empty. A last line without a newline
    /// (being written, or torn) comes back as it is: it does not parse. Zero bytes are not
    /// data: a run of them (the reserved tail of a mapped log, see `mapped`) is skipped, and
    /// one ends a line early (a record being copied in when read, or cut by a crash), so
    /// only whole records parse.
    fn next(&mut self, buf: &mut Vec<u8>) -> std::io::Result<Option<u64>> {
        buf.clear();
        loop {
            let avail = self.r.fill_buf()?;
            let zeros = avail.iter().take_while(|&&b| b == 0).count();
            if zeros == 0 {
                break;
            }
            self.r.consume(zeros);
            self.pos += zeros as u64;
        }
        let start = self.pos;
        let (mut any, mut over) = (false, false);
        self.complete = false;
        loop {
            let avail = self.r.fill_buf()?;
            if avail.is_empty() {
                return Ok(any.then_some(start));
            }
            any = true;
            let (take, done, ends) = match avail.iter().position(|&b| b == b'\n' || b == 0) {
                Some(i) => (i, true, avail[i] == b'\n'),
                None => (avail.len(), false, false),
            };
            if !over {
                if buf.len() + take <= LINE_MAX {
                    buf.extend_from_slice(&avail[..take]);
                } else {
                    over = true;
                    buf.clear();
                }
            }
            // A zero byte is left for the next call to skip.
            let used = take + usize::from(ends);
            self.complete = ends && !over;
            self.r.consume(used);
            self.pos += used as u64;
            if done {
                return Ok(Some(start));
            }
        }
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The log file, or None when it does not exist (nothing logged yet).
fn open(path: &Path) -> Result<Option<File>, LogError> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// The first statement line that starts at or after `from`: (where it starts, its seq).
fn probe(file: &File, from: u64, buf: &mut Vec<u8>) -> std::io::Result<Option<(u64, u64)>> {
    let mut lines = Lines::at(file.try_clone()?, from.saturating_sub(1))?;
    if from > 0 {
        // The rest of the line holding byte from-1: the next line starts at or after from.
        lines.next(buf)?;
    }
    while let Some(start) = lines.next(buf)? {
        if let Head::Statement(seq) = head(buf, lines.complete) {
            return Ok(Some((start, seq)));
        }
    }
    Ok(None)
}

/// Where to start reading for the statements after `after`: a line start before which
/// every statement has a lower or equal `seq`.
fn start_offset(file: &File, after: u64, buf: &mut Vec<u8>) -> std::io::Result<u64> {
    let below = |o: u64, buf: &mut Vec<u8>| -> std::io::Result<Option<u64>> {
        Ok(probe(file, o, buf)?
            .filter(|&(_, seq)| seq <= after)
            .map(|(s, _)| s))
    };
    let Some(mut best) = below(0, buf)? else {
        return Ok(0);
    };
    let (mut lo, mut hi) = (0u64, file.metadata()?.len());
    while hi - lo > BISECT_MIN {
        let mid = lo + (hi - lo) / 2;
        match below(mid, buf)? {
            Some(start) => {
                best = best.max(start);
                lo = mid;
            }
            None => hi = mid,
        }
    }
    Ok(best)
}

/// The highest statement `seq` in a log (0 when it has none).
pub(super) fn last_seq(path: &Path) -> Result<u64, LogError> {
    let Some(file) = open(path)? else {
        return Ok(0);
    };
    let mut lines = Lines::at(file, 0).map_err(io_err(path))?;
    let (mut buf, mut last) = (Vec::new(), 0);
    while lines.next(&mut buf).map_err(io_err(path))?.is_some() {
        if let Head::Statement(seq) = head(&buf, lines.complete) {
            last = last.max(seq);
        }
    }
    Ok(last)
}

/// Up to `limit` statements with `seq` greater than `after`, with their outcomes. Only the
/// page is held: the file is read line by line from where the page starts, and past its
/// last statement only until every outcome of the page was found (to the end of the file
/// when one of them never completed).
pub fn read_page(path: &Path, after: u64, limit: usize) -> Result<Page, LogError> {
    page(path, after, limit, PAGE_BYTES_MAX)
}

/// Every statement of a log with its outcome. Holds all of them: for small logs (tests);
/// use [`read_page`] or [`scan`] elsewhere.
pub fn read_statements(path: &Path) -> Result<Vec<LoggedStatement>, LogError> {
    Ok(page(path, 0, usize::MAX, usize::MAX)?.statements)
}

fn page(path: &Path, after: u64, limit: usize, bytes_max: usize) -> Result<Page, LogError> {
    let err = io_err(path);
    let mut out = Page::default();
    if limit == 0 {
        return Ok(out);
    }
    let Some(file) = open(path)? else {
        return Ok(out);
    };
    let mut buf = Vec::new();
    let start = if after == 0 {
        0
    } else {
        start_offset(&file, after, &mut buf).map_err(&err)?
    };
    let mut defs = Defs::open(&file).map_err(&err)?;
    let mut lines = Lines::at(file, start).map_err(&err)?;
    let mut index: HashMap<u64, usize> = HashMap::new();
    let (mut waiting, mut bytes, mut full) = (0usize, 0usize, false);
    while lines.next(&mut buf).map_err(&err)?.is_some() {
        match head(&buf, lines.complete) {
            Head::Statement(seq) if !full && seq > after => {
                if let Some(Stored::Statement(s)) = stored(&mut defs, &buf) {
                    bytes += s.statement.text.len()
                        + s.statement
                            .params
                            .iter()
                            .flatten()
                            .map(String::len)
                            .sum::<usize>();
                    index.insert(s.statement.seq, out.statements.len());
                    out.statements.push(LoggedStatement {
                        statement: s.statement,
                        cut: s.cut,
                        outcome: None,
                        kind_source: None,
                        front: None,
                        front_seq: None,
                    });
                    waiting += 1;
                    full = out.statements.len() >= limit || bytes >= bytes_max;
                }
            }
            Head::Outcome(seq) if index.contains_key(&seq) => {
                if let Some(Stored::Outcome(o)) = stored(&mut defs, &buf) {
                    let slot = &mut out.statements[index[&seq]].outcome;
                    if slot.is_none() {
                        waiting -= 1;
                    }
                    *slot = Some(o);
                }
            }
            _ => {}
        }
        if full && waiting == 0 {
            break;
        }
    }
    if full {
        out.next_after = out.statements.last().map(|s| s.statement.seq);
    }
    for s in &mut out.statements {
        s.settle_kind();
    }
    Ok(out)
}

/// Call `f` with every record of a log, in file order (lines that do not parse, such as a
/// torn last line, are skipped). Holds one record at a time.
pub fn scan(path: &Path, mut f: impl FnMut(LogEntry)) -> Result<(), LogError> {
    let Some(mut records) = Records::open(path)? else {
        return Ok(());
    };
    while let Some(e) = records.next_entry()? {
        f(e);
    }
    Ok(())
}

/// The records of one log file in file order, pulled one at a time (what [`scan`] walks;
/// the merged reader of several fronts' files pulls from one of these per file).
pub(in crate::journal::log) struct Records {
    path: std::path::PathBuf,
    defs: Defs,
    lines: Lines,
    buf: Vec<u8>,
}

impl Records {
    /// The records of the file at `path`; None when it does not exist.
    pub(in crate::journal::log) fn open(path: &Path) -> Result<Option<Records>, LogError> {
        let err = io_err(path);
        let Some(file) = open(path)? else {
            return Ok(None);
        };
        let defs = Defs::open(&file).map_err(&err)?;
        let lines = Lines::at(file, 0).map_err(&err)?;
        Ok(Some(Records {
            path: path.to_path_buf(),
            defs,
            lines,
            buf: Vec::new(),
        }))
    }

    /// The next record (lines that do not parse are skipped); None at the end.
    pub(in crate::journal::log) fn next_entry(&mut self) -> Result<Option<LogEntry>, LogError> {
        loop {
            let Some(offset) = self.lines.next(&mut self.buf).map_err(io_err(&self.path))? else {
                return Ok(None);
            };
            if head(&self.buf, self.lines.complete) == Head::Other {
                continue;
            }
            match stored(&mut self.defs, &self.buf) {
                Some(Stored::Statement(s)) => {
                    return Ok(Some(LogEntry::Statement {
                        offset,
                        statement: s.statement,
                        cut: s.cut,
                    }))
                }
                Some(Stored::Outcome(o)) => return Ok(Some(LogEntry::Outcome(o))),
                None => {}
            }
        }
    }
}

/// Where the lines of a log start that are neither a record nor a definition (a torn last
/// record after a SIGKILL, or damage); the reserved zeros of a mapped log are not lines.
pub fn unreadable_lines(path: &Path) -> Result<Vec<u64>, LogError> {
    let err = io_err(path);
    let mut bad = Vec::new();
    let Some(file) = open(path)? else {
        return Ok(bad);
    };
    let mut defs = Defs::open(&file).map_err(&err)?;
    let mut lines = Lines::at(file, 0).map_err(&err)?;
    let mut buf = Vec::new();
    while let Some(offset) = lines.next(&mut buf).map_err(&err)? {
        let meta = lines.complete && defs::is_meta(&buf) && buf.last() == Some(&b'}');
        let record = head(&buf, lines.complete) != Head::Other && stored(&mut defs, &buf).is_some();
        if !meta && !record {
            bad.push(offset);
        }
    }
    Ok(bad)
}

/// The statement record whose line starts at `offset` (from a [`LogEntry::Statement`]).
pub fn statement_at(path: &Path, offset: u64) -> Result<Option<StatementRecord>, LogError> {
    let err = io_err(path);
    let Some(file) = open(path)? else {
        return Ok(None);
    };
    let mut defs = Defs::open(&file).map_err(&err)?;
    let mut lines = Lines::at(file, offset).map_err(&err)?;
    let mut buf = Vec::new();
    if lines.next(&mut buf).map_err(&err)?.is_none() || head(&buf, lines.complete) == Head::Other {
        return Ok(None);
    }
    match stored(&mut defs, &buf) {
        Some(Stored::Statement(s)) => Ok(Some(s.statement)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests;
