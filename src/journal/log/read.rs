//! Reading a statement log without loading it: lines through a bounded buffer, a page of
//! statements at a time. Statement records are written in `seq` order (see
//! `TokenLog::append`), so the start of a page is found by bisecting the file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;

use super::{LogError, LoggedStatement, OutcomeRecord, StatementRecord, TextCut};

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

fn head(line: &[u8]) -> Head {
    const STATEMENT: &[u8] = b"{\"type\":\"statement\",\"seq\":";
    const OUTCOME: &[u8] = b"{\"type\":\"outcome\",\"seq\":";
    let (rest, statement) = if let Some(r) = line.strip_prefix(STATEMENT) {
        (r, true)
    } else if let Some(r) = line.strip_prefix(OUTCOME) {
        (r, false)
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
}

impl Lines {
    fn at(file: File, pos: u64) -> std::io::Result<Lines> {
        let mut r = BufReader::with_capacity(64 << 10, file);
        r.seek(SeekFrom::Start(pos))?;
        Ok(Lines { r, pos })
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
        if let Head::Statement(seq) = head(buf) {
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
        if let Head::Statement(seq) = head(&buf) {
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
    let mut lines = Lines::at(file, start).map_err(&err)?;
    let mut index: HashMap<u64, usize> = HashMap::new();
    let (mut waiting, mut bytes, mut full) = (0usize, 0usize, false);
    while lines.next(&mut buf).map_err(&err)?.is_some() {
        match head(&buf) {
            Head::Statement(seq) if !full && seq > after => {
                if let Ok(Stored::Statement(s)) = serde_json::from_slice(&buf) {
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
                    });
                    waiting += 1;
                    full = out.statements.len() >= limit || bytes >= bytes_max;
                }
            }
            Head::Outcome(seq) if index.contains_key(&seq) => {
                if let Ok(Stored::Outcome(o)) = serde_json::from_slice(&buf) {
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
    Ok(out)
}

/// Call `f` with every record of a log, in file order (lines that do not parse, such as a
/// torn last line, are skipped). Holds one record at a time.
pub fn scan(path: &Path, mut f: impl FnMut(LogEntry)) -> Result<(), LogError> {
    let err = io_err(path);
    let Some(file) = open(path)? else {
        return Ok(());
    };
    let mut lines = Lines::at(file, 0).map_err(&err)?;
    let mut buf = Vec::new();
    while let Some(offset) = lines.next(&mut buf).map_err(&err)? {
        if head(&buf) == Head::Other {
            continue;
        }
        match serde_json::from_slice(&buf) {
            Ok(Stored::Statement(s)) => f(LogEntry::Statement {
                offset,
                statement: s.statement,
                cut: s.cut,
            }),
            Ok(Stored::Outcome(o)) => f(LogEntry::Outcome(o)),
            Err(_) => {}
        }
    }
    Ok(())
}

/// The statement record whose line starts at `offset` (from a [`LogEntry::Statement`]).
pub fn statement_at(path: &Path, offset: u64) -> Result<Option<StatementRecord>, LogError> {
    let err = io_err(path);
    let Some(file) = open(path)? else {
        return Ok(None);
    };
    let mut lines = Lines::at(file, offset).map_err(&err)?;
    let mut buf = Vec::new();
    if lines.next(&mut buf).map_err(&err)?.is_none() {
        return Ok(None);
    }
    match serde_json::from_slice(&buf) {
        Ok(Stored::Statement(s)) => Ok(Some(s.statement)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{to_line, LogRecord, TokenLog, BUSY_WRITES, TEXT_MAX};
    use super::*;

    fn statement(seq: u64, text: &str) -> LogRecord {
        LogRecord::Statement(StatementRecord {
            seq,
            ts: "2026-01-01T00:00:00Z".into(),
            token: "sp_t".into(),
            task: "k".into(),
            session: 1,
            protocol: "simple".into(),
            text: text.into(),
            params: Vec::new(),
            kind: "read".into(),
        })
    }

    fn outcome(seq: u64) -> LogRecord {
        LogRecord::Outcome(OutcomeRecord {
            seq,
            ts: "2026-01-01T00:00:00Z".into(),
            rows: Some(seq),
            capped: false,
            duration_ms: 1.0,
            sqlstate: None,
            tag: Some("SELECT 1".into()),
            skipped: false,
            denied: false,
        })
    }

    #[test]
    fn heads_are_read_from_the_stored_lines() {
        let line = to_line(&statement(42, "select 1")).unwrap();
        assert_eq!(head(&line[..line.len() - 1]), Head::Statement(42));
        let line = to_line(&outcome(7)).unwrap();
        assert_eq!(head(&line[..line.len() - 1]), Head::Outcome(7));
        // Torn: no closing brace.
        assert_eq!(head(&line[..line.len() - 5]), Head::Other);
        assert_eq!(head(b"garbage"), Head::Other);
        // Keys in another order (a log written by hand or another tool).
        assert_eq!(
            head(br#"{"kind":"read","seq":5,"text":"x","type":"statement"}"#),
            Head::Statement(5)
        );
    }

    #[test]
    fn pages_start_where_they_should_and_pair_outcomes() {
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        let n = 5000;
        // Outcomes lag their statements by a few records, as with pipelined sessions; the
        // statement of every 1000th never completes.
        for seq in 1..=n {
            assert_eq!(log.next_seq(), seq);
            log.append(&statement(
                seq,
                &format!("select {seq} -- {}", "x".repeat(seq as usize % 50)),
            ))
            .unwrap();
            if seq > 3 && (seq - 3) % 1000 != 0 {
                log.append(&outcome(seq - 3)).unwrap();
            }
        }
        let path = log.path().to_path_buf();
        let mut after = 0;
        let mut seen = 0;
        loop {
            let p = read_page(&path, after, 777).unwrap();
            for s in &p.statements {
                seen += 1;
                assert_eq!(s.statement.seq, seen);
                let done = s.outcome.is_some();
                let expect = seen + 3 <= n && seen % 1000 != 0;
                assert_eq!(done, expect, "seq {seen}");
            }
            match p.next_after {
                Some(a) => after = a,
                None => break,
            }
        }
        assert_eq!(seen, n);
        // A page from the middle starts right after `after`.
        let p = read_page(&path, 4321, 3).unwrap();
        let seqs: Vec<u64> = p.statements.iter().map(|s| s.statement.seq).collect();
        assert_eq!(seqs, vec![4322, 4323, 4324]);
        assert_eq!(p.next_after, Some(4324));
        assert!(read_page(&path, n, 10).unwrap().statements.is_empty());
        assert_eq!(last_seq(&path).unwrap(), n);
        assert_eq!(read_statements(&path).unwrap().len(), n as usize);
    }

    fn defer(log: &TokenLog, seq: u64) {
        let LogRecord::Outcome(o) = outcome(seq) else {
            unreachable!()
        };
        log.defer_outcome(&super::super::line::outcome_ref(&o))
            .unwrap();
    }

    #[test]
    fn deferred_outcomes_lead_the_next_statement_and_are_paired_with_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        let path = log.path().to_path_buf();
        let len = |p: &Path| std::fs::metadata(p).unwrap().len();
        log.append(&statement(log.next_seq(), "select 1")).unwrap();
        let written = len(&path);
        defer(&log, 1);
        // Deferred: not in the file yet, the statement reads as not (yet) completed.
        assert_eq!(len(&path), written);
        assert!(read_statements(&path).unwrap()[0].outcome.is_none());
        log.append(&statement(log.next_seq(), "select 2")).unwrap();
        let mut kinds = Vec::new();
        scan(&path, |e| {
            kinds.push(match e {
                LogEntry::Statement { statement, .. } => format!("s{}", statement.seq),
                LogEntry::Outcome(o) => format!("o{}", o.seq),
            })
        })
        .unwrap();
        assert_eq!(kinds, ["s1", "o1", "s2"]);
        defer(&log, 2);
        log.append(&statement(log.next_seq(), "select 3")).unwrap();
        defer(&log, 3);
        log.flush_outcomes().unwrap();
        let all = read_statements(&path).unwrap();
        assert!(all
            .iter()
            .all(|s| s.outcome.as_ref().map(|o| o.seq) == Some(s.statement.seq)));
        // Dropping the log writes what is still deferred.
        log.append(&statement(log.next_seq(), "select 4")).unwrap();
        defer(&log, 4);
        drop(log);
        assert!(read_statements(&path).unwrap()[3].outcome.is_some());
    }

    #[test]
    fn a_busy_log_is_mapped_read_while_mapped_and_released_when_idle() {
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        let path = log.path().to_path_buf();
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        for i in 0..BUSY_WRITES - 1 {
            log.append(&statement(log.next_seq(), &format!("select {i}")))
                .unwrap();
        }
        log.adapt();
        assert!(!log.is_mapped(), "not busy enough");
        for i in 0..BUSY_WRITES {
            log.append(&statement(log.next_seq(), &format!("select {i}")))
                .unwrap();
        }
        log.adapt();
        assert!(log.is_mapped());
        let n = 2 * BUSY_WRITES - 1;
        log.append(&statement(log.next_seq(), "select 'mapped'"))
            .unwrap();
        defer(&log, n + 1);
        log.append(&statement(log.next_seq(), "select 'mapped 2'"))
            .unwrap();
        // The file holds a reserved tail of zeros past its records; readers see each record.
        assert!(size(&path) > log.data_len());
        let all = read_statements(&path).unwrap();
        assert_eq!(all.len() as u64, n + 2);
        assert_eq!(all[n as usize].statement.text, "select 'mapped'");
        assert!(all[n as usize].outcome.is_some());
        // Written since the last tick: stays mapped; a tick with no write: released.
        log.adapt();
        assert!(log.is_mapped());
        log.adapt();
        assert!(!log.is_mapped());
        assert_eq!(size(&path), log.data_len());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with('\n'));
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
        // Plain writes again, after the released tail.
        log.append(&statement(log.next_seq(), "select 'plain'"))
            .unwrap();
        assert_eq!(size(&path), log.data_len());
        assert_eq!(read_statements(&path).unwrap().len() as u64, n + 3);
    }

    #[test]
    fn a_log_left_mapped_by_a_crash_goes_on_after_its_records() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        let path = log.path().to_path_buf();
        for i in 0..BUSY_WRITES {
            log.append(&statement(log.next_seq(), &format!("select {i}")))
                .unwrap();
        }
        log.adapt();
        assert!(log.is_mapped());
        log.append(&statement(log.next_seq(), "select 'last'"))
            .unwrap();
        let len = log.data_len();
        // Killed while copying a record in: part of it landed, with zeros inside and the
        // reservation's zeros after; nothing released.
        std::mem::forget(log);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(
            b"{\"type\":\"statement\",\"seq\":99,\0\0\0\"kind\":\"read\"}\n",
            len,
        )
        .unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > len + 40);
        // Read as it is: every whole record, not the torn one.
        let all = read_statements(&path).unwrap();
        assert_eq!(all.len() as u64, BUSY_WRITES + 1);
        assert_eq!(all.last().unwrap().statement.text, "select 'last'");
        // Opened again: the zeros are cut off and the log goes on after its records.
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), log.data_len());
        log.append(&statement(log.next_seq(), "select 'after'"))
            .unwrap();
        let all = read_statements(&path).unwrap();
        assert_eq!(all.len() as u64, BUSY_WRITES + 2);
        assert_eq!(all.last().unwrap().statement.text, "select 'after'");
        assert!(all.iter().all(|s| s.statement.seq != 99));
    }

    #[test]
    fn the_idle_ticker_writes_outcomes_only_after_a_tick_with_no_write() {
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        let path = log.path().to_path_buf();
        let outcomes = |p: &Path| {
            read_statements(p)
                .unwrap()
                .iter()
                .filter(|s| s.outcome.is_some())
                .count()
        };
        log.append(&statement(log.next_seq(), "select 1")).unwrap();
        defer(&log, 1);
        log.flush_idle_outcomes().unwrap();
        assert_eq!(outcomes(&path), 0, "first tick: only noted");
        // Busy: the next statement carries it; the outcome deferred after is not idle yet.
        log.append(&statement(log.next_seq(), "select 2")).unwrap();
        defer(&log, 2);
        log.flush_idle_outcomes().unwrap();
        assert_eq!(outcomes(&path), 1);
        // Idle for a whole tick: written.
        log.flush_idle_outcomes().unwrap();
        assert_eq!(outcomes(&path), 2);
    }

    #[test]
    fn a_statement_refused_by_the_quota_still_writes_the_deferred_outcomes() {
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 400).unwrap();
        log.append(&statement(log.next_seq(), "select 1")).unwrap();
        defer(&log, 1);
        let refused = log.append(&statement(log.next_seq(), &"y".repeat(400)));
        assert!(
            matches!(refused, Err(LogError::Quota { .. })),
            "{refused:?}"
        );
        let all = read_statements(log.path()).unwrap();
        assert_eq!(all.len(), 1);
        assert!(all[0].outcome.is_some());
    }

    #[test]
    fn long_text_is_cut_with_length_and_digest() {
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        // Multi-byte characters across the cut: it falls on a character boundary.
        let text = format!("select '{}'", "é".repeat(TEXT_MAX));
        log.append(&statement(log.next_seq(), &text)).unwrap();
        let all = read_statements(log.path()).unwrap();
        let s = &all[0];
        assert!(s.statement.text.len() <= TEXT_MAX && s.statement.text.len() > TEXT_MAX - 4);
        assert!(text.starts_with(&s.statement.text));
        let cut = s.cut.as_ref().unwrap();
        assert_eq!(cut.text_len, text.len() as u64);
        assert_eq!(
            cut.text_sha256,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()))
        );
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["text_len"], text.len() as u64);
    }

    #[test]
    fn quota_refuses_statements_but_not_outcomes_and_a_torn_tail_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 2000).unwrap();
        let mut written = 0;
        loop {
            let seq = log.next_seq();
            match log.append(&statement(seq, &"y".repeat(100))) {
                Ok(()) => written += 1,
                Err(LogError::Quota { max, .. }) => {
                    assert_eq!(max, 2000);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(written > 3);
        log.append(&outcome(1)).unwrap();
        let path = log.path().to_path_buf();
        drop(log);
        // A crash cut the last record: the next one starts on its own line.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, b"{\"type\":\"statement\",\"seq\":99").unwrap();
        let log = TokenLog::open(dir.path(), "k", "sp_t", 0).unwrap();
        log.append(&statement(log.next_seq(), "select 2")).unwrap();
        let all = read_statements(&path).unwrap();
        assert_eq!(all.len(), written + 1);
        assert!(all[0].outcome.is_some());
        assert_eq!(all.last().unwrap().statement.text, "select 2");
    }
}
