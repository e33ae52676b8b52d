//! The writer's side of format version 2: the log's header line, and each distinct text
//! (statement text, tag words, SQLSTATE, unusual kinds) written once as a definition line
//! that compact records refer to by its file offset (so a reader resolves a reference with
//! one read, from anywhere in the file, with no index). Anything a compact record cannot
//! hold exactly (another token's record, a time in another shape) is written as a JSON line.

use std::collections::HashMap;

use super::compact::{self, Ref};
use super::line::{self, cut_text, put_str, OutcomeRef, StatementRef};

/// Bytes of distinct texts a log remembers (per token, in memory); texts past it are
/// defined again at each use (still correct, only longer). Bounds what an agent sending only
/// distinct texts makes the gateway hold.
const DICT_MAX: usize = 8 << 20;

/// A version 2 log's writing state.
pub(super) struct Interner {
    /// Unix nanoseconds that record times count from.
    epoch: u64,
    token: String,
    task: String,
    /// Text to the offset of its definition line.
    dict: HashMap<Box<str>, u64>,
    dict_bytes: usize,
    /// The last statement text and its offset: a repeated statement skips the hash.
    last: Option<(Box<str>, u64)>,
}

impl Interner {
    pub(super) fn new(token: &str, task: &str, epoch: u64) -> Interner {
        Interner {
            epoch,
            token: token.to_string(),
            task: task.to_string(),
            dict: HashMap::new(),
            dict_bytes: 0,
            last: None,
        }
    }

    /// The header line a version 2 log starts with.
    pub(super) fn header_line(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"type\":\"log\",\"version\":2,\"token\":");
        put_str(out, &self.token);
        out.extend_from_slice(b",\"task\":");
        put_str(out, &self.task);
        out.extend_from_slice(format!(",\"epoch_ns\":{}}}\n", self.epoch).as_bytes());
    }

    /// Forget every definition (a write that carried some failed or was refused).
    pub(super) fn forget(&mut self) {
        self.dict.clear();
        self.dict_bytes = 0;
        self.last = None;
    }

    fn ts(&self, ts: Option<&str>) -> Option<u64> {
        let ns = match ts {
            None => line::now_ns(),
            Some(t) => line::time_ns(t)?,
        };
        ns.checked_sub(self.epoch)
    }

    /// A reference to `text`, appending its definition to `out` (whose first byte lands at
    /// file offset `at`) when it has none yet; true in `defined` then.
    fn text_ref(
        &mut self,
        out: &mut Vec<u8>,
        at: u64,
        text: &str,
        cut: Option<&(u64, String)>,
        defined: &mut bool,
    ) -> Ref {
        if cut.is_none() {
            if let Some((t, off)) = &self.last {
                if **t == *text {
                    return Ref::At(*off);
                }
            }
            if let Some(&off) = self.dict.get(text) {
                return Ref::At(off);
            }
        }
        let off = at + out.len() as u64;
        out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
        put_str(out, text);
        if let Some((len, sha)) = cut {
            out.extend_from_slice(
                format!(",\"text_len\":{len},\"text_sha256\":\"{sha}\"").as_bytes(),
            );
        }
        out.extend_from_slice(b"}\n");
        *defined = true;
        if cut.is_none() && self.dict_bytes + text.len() <= DICT_MAX {
            self.dict_bytes += text.len();
            self.dict.insert(text.into(), off);
        }
        Ref::At(off)
    }

    fn word_ref(&mut self, out: &mut Vec<u8>, at: u64, w: &str, defined: &mut bool) -> Ref {
        match Ref::word(w) {
            Some(r) => r,
            None => self.text_ref(out, at, w, None, defined),
        }
    }

    /// Appends the statement's compact record to `out` (first byte at file offset `at`),
    /// after the definitions it needs; false (nothing appended) when it cannot be compact.
    pub(super) fn statement(&mut self, out: &mut Vec<u8>, at: u64, s: &StatementRef<'_>) -> bool {
        if s.token != self.token || s.task != self.task {
            return false;
        }
        let Some(ts) = self.ts(s.ts) else {
            return false;
        };
        let (text, cut) = cut_text(s.text);
        let mut defined = false;
        let protocol = self.word_ref(out, at, s.protocol, &mut defined);
        let text_ref = self.text_ref(out, at, text, cut.as_ref(), &mut defined);
        if let (None, Ref::At(off)) = (&cut, text_ref) {
            if self.last.as_ref().is_none_or(|(t, _)| **t != *text) {
                self.last = Some((text.into(), off));
            }
        }
        let kind = self.word_ref(out, at, s.kind, &mut defined);
        let rec = compact::Statement {
            seq: s.seq,
            ts,
            session: s.session,
            protocol,
            text: text_ref,
            kind,
        };
        compact::put_statement(out, &rec, s.params);
        true
    }

    /// Appends the outcome's compact record to `out` (first byte at file offset `at`), after
    /// the definitions it needs: Some(whether it defined any), or None (nothing appended)
    /// when it cannot be compact.
    pub(super) fn outcome(
        &mut self,
        out: &mut Vec<u8>,
        at: u64,
        o: &OutcomeRef<'_>,
    ) -> Option<bool> {
        let ts = self.ts(o.ts)?;
        let mut defined = false;
        let sqlstate = o.sqlstate.map(|s| self.word_ref(out, at, s, &mut defined));
        let tag = o.tag.map(|t| {
            let (words, n) = compact::split_tag(t);
            (self.word_ref(out, at, words, &mut defined), n)
        });
        let kind = o.kind.map(|k| self.word_ref(out, at, k, &mut defined));
        let rec = compact::Outcome {
            seq: o.seq,
            ts,
            rows: o.rows,
            capped: o.capped,
            micros: o.micros,
            sqlstate,
            tag,
            skipped: o.skipped,
            denied: o.denied,
            kind,
        };
        compact::put_outcome(out, &rec);
        Some(defined)
    }
}
