//! The reader's side of format version 2: a log's header, and compact records expanded back
//! into the records they were made from (references resolved by reading the definition line
//! at their offset, a few cached), so readers give the same JSON as for a version 1 line.
//! Every read is bounded; a reference that does not lead to a definition makes its record
//! unreadable (skipped), never a crash.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::rc::Rc;

use serde::Deserialize;

use super::compact::{self, Ref, WORDS};
use super::line::time_text;
use super::{OutcomeRecord, StatementRecord, TextCut};

/// Longest definition line read (a 64 KiB text escaped as `\u00XX` throughout, and more).
const DEF_LINE_MAX: usize = 1 << 20;
/// Definitions kept at once by a reader.
const CACHE_MAX: usize = 4096;

/// What a version 2 log's first line says.
#[derive(Debug, Deserialize)]
pub(super) struct Header {
    #[serde(rename = "type")]
    kind: String,
    version: u32,
    pub token: String,
    pub task: String,
    pub epoch_ns: u64,
}

/// The header of a version 2 log (None: a version 1 or empty log).
pub(super) fn header_of(file: &File) -> std::io::Result<Option<Header>> {
    Ok(line_at(file, 0, 64 << 10)?
        .and_then(|l| serde_json::from_slice::<Header>(&l).ok())
        .filter(|h| h.kind == "log" && h.version == 2))
}

#[derive(Deserialize)]
struct Def {
    #[serde(rename = "type")]
    kind: String,
    text: String,
    #[serde(flatten)]
    cut: Option<TextCut>,
}

/// Whether a line is a header or a definition (not a record; skipped by readers).
pub(super) fn is_meta(line: &[u8]) -> bool {
    line.starts_with(b"{\"type\":\"text\",") || line.starts_with(b"{\"type\":\"log\",")
}

/// The line at `off` (without its newline); None when there is none whole there.
fn line_at(file: &File, off: u64, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let mut chunk = 4096usize;
    loop {
        let from = buf.len();
        buf.resize(from + chunk, 0);
        let n = file.read_at(&mut buf[from..], off + from as u64)?;
        buf.truncate(from + n);
        if let Some(i) = buf[from..].iter().position(|&b| b == b'\n' || b == 0) {
            let end = from + i;
            return Ok((buf[end] == b'\n').then(|| {
                buf.truncate(end);
                buf
            }));
        }
        if n == 0 || buf.len() >= max {
            return Ok(None);
        }
        chunk = (chunk * 2).min(max - buf.len()).max(1);
    }
}

/// Expands a log's compact records: its header and the definitions read so far.
pub(super) struct Defs {
    file: File,
    header: Option<Header>,
    cache: HashMap<u64, Rc<(String, Option<TextCut>)>>,
}

impl Defs {
    /// The expander of an open log (its header read; a version 1 log has none, and none of
    /// its lines are compact).
    pub(super) fn open(file: &File) -> std::io::Result<Defs> {
        let file = file.try_clone()?;
        let header = header_of(&file)?;
        Ok(Defs {
            file,
            header,
            cache: HashMap::new(),
        })
    }

    fn def(&mut self, off: u64) -> Option<Rc<(String, Option<TextCut>)>> {
        if let Some(d) = self.cache.get(&off) {
            return Some(d.clone());
        }
        let line = line_at(&self.file, off, DEF_LINE_MAX).ok()??;
        let d = serde_json::from_slice::<Def>(&line)
            .ok()
            .filter(|d| d.kind == "text")?;
        if self.cache.len() >= CACHE_MAX {
            self.cache.clear();
        }
        let d = Rc::new((d.text, d.cut));
        self.cache.insert(off, d.clone());
        Some(d)
    }

    fn word(&mut self, r: Ref) -> Option<String> {
        match r {
            Ref::Word(i) => WORDS.get(usize::from(i)).map(|w| (*w).to_string()),
            Ref::At(off) => Some(self.def(off)?.0.clone()),
        }
    }

    fn time(&self, ts: u64) -> Option<String> {
        let h = self.header.as_ref()?;
        Some(time_text(h.epoch_ns.checked_add(ts)?))
    }

    /// A compact statement line (without its newline) as the record it was made from.
    pub(super) fn statement(&mut self, line: &[u8]) -> Option<(StatementRecord, Option<TextCut>)> {
        let (s, params) = compact::statement(line)?;
        let ts = self.time(s.ts)?;
        let (text, cut) = match s.text {
            compact::Text::Inline(t) => (t.into_owned(), None),
            compact::Text::Ref(Ref::At(off)) => {
                let d = self.def(off)?;
                (d.0.clone(), d.1.clone())
            }
            compact::Text::Ref(w) => (self.word(w)?, None),
        };
        let h = self.header.as_ref()?;
        let (token, task) = (h.token.clone(), h.task.clone());
        Some((
            StatementRecord {
                seq: s.seq,
                ts,
                token,
                task,
                session: s.session,
                protocol: self.word(s.protocol)?,
                text,
                params,
                kind: self.word(s.kind)?,
            },
            cut,
        ))
    }

    /// A compact outcome line (without its newline) as the record it was made from.
    pub(super) fn outcome(&mut self, line: &[u8]) -> Option<OutcomeRecord> {
        let o = compact::outcome(line)?;
        let tag = match o.tag {
            Some((r, n)) => Some(compact::join_tag(&self.word(r)?, n)),
            None => None,
        };
        let sqlstate = match o.sqlstate {
            Some(r) => Some(self.word(r)?),
            None => None,
        };
        let kind = match o.kind {
            Some(r) => Some(self.word(r)?),
            None => None,
        };
        Some(OutcomeRecord {
            seq: o.seq,
            ts: self.time(o.ts)?,
            rows: o.rows,
            capped: o.capped,
            // Exactly what parsing the JSON line's three decimals gives: both are the
            // double nearest to micros / 1000.
            duration_ms: o.micros as f64 / 1000.0,
            sqlstate,
            tag,
            skipped: o.skipped,
            denied: o.denied,
            kind,
        })
    }
}
