//! One token's log read from several fronts' files as one log.
//!
//! The order: each front's file is read in its own order (its `seq` order, which is the
//! order its statements were forwarded), and the files are merged by the statement record's
//! time, then the front's id, then the front's `seq`: at each step the earliest next
//! statement of any file comes out. A front's statements therefore never change places
//! among themselves (even if its clock stepped back), and two fronts' statements come out
//! in the order their fronts' clocks say they arrived. Outcomes follow their statements.
//! Merged statements are numbered 1, 2, … in that order (their `seq` as readers see it);
//! `front` and `front_seq` say where each came from.
//!
//! A statement logged later through a front whose clock is behind another's can sort
//! before statements already read: a page cursor (`after`, a position) is exact once the
//! token's sessions are over, and as good as the fronts' clocks agree while they run.

use std::collections::HashMap;

use super::read::Records;
use super::{FrontFile, LogEntry, LogError, LoggedStatement, Page};

/// A record of the merged log, and where it came from.
pub(super) struct Merged {
    /// Index of its file in the list given.
    pub file: usize,
    /// The statement's `seq` in its own file.
    pub front_seq: u64,
    /// The record, its `seq` renumbered to the merged position.
    pub entry: LogEntry,
}

/// One file being merged: its reader and its next record.
struct Cursor {
    records: Records,
    head: Option<LogEntry>,
    /// The head's sort time (nanoseconds since the epoch) when it is a statement.
    at: i128,
}

impl Cursor {
    fn open(f: &FrontFile) -> Result<Option<Cursor>, LogError> {
        let Some(records) = Records::open(&f.path)? else {
            return Ok(None);
        };
        let mut c = Cursor {
            records,
            head: None,
            at: 0,
        };
        c.advance()?;
        Ok(Some(c))
    }

    /// Takes the head and reads the next record.
    fn advance(&mut self) -> Result<Option<LogEntry>, LogError> {
        let next = self.records.next_entry()?;
        self.at = match &next {
            Some(LogEntry::Statement { statement, .. }) => sort_time(&statement.ts),
            _ => 0,
        };
        Ok(std::mem::replace(&mut self.head, next))
    }

    /// The sort key of its head statement, if its head is one.
    fn key(&self) -> Option<(i128, u64)> {
        match &self.head {
            Some(LogEntry::Statement { statement, .. }) => Some((self.at, statement.seq)),
            _ => None,
        }
    }
}

/// A record's time as nanoseconds; one that does not parse sorts first (its file's order
/// still holds).
fn sort_time(ts: &str) -> i128 {
    crate::rfc3339::parse(ts)
        .map(|t| t.unix_timestamp_nanos())
        .unwrap_or(i128::MIN)
}

/// Calls `f` with every record of the merged log (see the module's order) until it returns
/// false. Holds one record per file, and the merged number of each statement whose outcome
/// has not come yet.
pub(super) fn scan(files: &[FrontFile], mut f: impl FnMut(Merged) -> bool) -> Result<(), LogError> {
    let mut cursors: Vec<(usize, Cursor)> = Vec::with_capacity(files.len());
    for (i, file) in files.iter().enumerate() {
        if let Some(c) = Cursor::open(file)? {
            cursors.push((i, c));
        }
    }
    let mut pos = 0u64;
    let mut pending: HashMap<(usize, u64), u64> = HashMap::new();
    loop {
        // Outcomes at the heads first: each follows its own statement in its file.
        for (i, c) in cursors.iter_mut() {
            while matches!(c.head, Some(LogEntry::Outcome(_))) {
                let Some(LogEntry::Outcome(mut o)) = c.advance()? else {
                    break;
                };
                if let Some(p) = pending.remove(&(*i, o.seq)) {
                    let front_seq = std::mem::replace(&mut o.seq, p);
                    let go_on = f(Merged {
                        file: *i,
                        front_seq,
                        entry: LogEntry::Outcome(o),
                    });
                    if !go_on {
                        return Ok(());
                    }
                }
            }
        }
        // Files are in front-id order, so the index breaks a tie of times as the id does.
        let next = cursors
            .iter()
            .enumerate()
            .filter_map(|(n, (i, c))| c.key().map(|(at, seq)| ((at, *i, seq), n)))
            .min();
        let Some((_, n)) = next else {
            return Ok(());
        };
        let (i, c) = &mut cursors[n];
        let Some(LogEntry::Statement {
            offset,
            mut statement,
            cut,
        }) = c.advance()?
        else {
            continue;
        };
        pos += 1;
        let front_seq = std::mem::replace(&mut statement.seq, pos);
        pending.insert((*i, front_seq), pos);
        let go_on = f(Merged {
            file: *i,
            front_seq,
            entry: LogEntry::Statement {
                offset,
                statement,
                cut,
            },
        });
        if !go_on {
            return Ok(());
        }
    }
}

/// Up to `limit` merged statements after position `after`, with their outcomes, stopping
/// early past `bytes_max` bytes of text (see `read::read_page`). Reads from the start of
/// every file (positions are only known by merging), and past the page only until every
/// outcome of the page was found.
pub(super) fn page(
    files: &[FrontFile],
    after: u64,
    limit: usize,
    bytes_max: usize,
) -> Result<Page, LogError> {
    let mut out = Page::default();
    if limit == 0 {
        return Ok(out);
    }
    let mut index: HashMap<u64, usize> = HashMap::new();
    let (mut waiting, mut bytes, mut full) = (0usize, 0usize, false);
    scan(files, |m| {
        match m.entry {
            LogEntry::Statement { statement, cut, .. } if !full && statement.seq > after => {
                bytes += statement.text.len()
                    + statement
                        .params
                        .iter()
                        .flatten()
                        .map(String::len)
                        .sum::<usize>();
                index.insert(statement.seq, out.statements.len());
                out.statements.push(LoggedStatement {
                    statement,
                    cut,
                    outcome: None,
                    kind_source: None,
                    front: Some(files[m.file].front.clone()),
                    front_seq: Some(m.front_seq),
                });
                waiting += 1;
                full = out.statements.len() >= limit || bytes >= bytes_max;
            }
            LogEntry::Outcome(o) => {
                if let Some(&at) = index.get(&o.seq) {
                    let slot = &mut out.statements[at].outcome;
                    if slot.is_none() {
                        waiting -= 1;
                    }
                    *slot = Some(o);
                }
            }
            LogEntry::Statement { .. } => {}
        }
        !(full && waiting == 0)
    })?;
    if full {
        out.next_after = out.statements.last().map(|s| s.statement.seq);
    }
    for s in &mut out.statements {
        s.settle_kind();
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
