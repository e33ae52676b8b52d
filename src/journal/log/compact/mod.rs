//! The compact record codec (log format version 2): a statement or outcome record as one
//! short line of variable-length integers, with every text (statement text, tag, SQLSTATE,
//! an unusual kind) a reference to a definition line written once per log (see `dict`).
//! Pure: no I/O, table-tested in `tests.rs`.
//!
//! No encoded byte is `\0` or `\n`, so compact lines share the file with JSON lines and go
//! through the same line reader (a zero byte ends a line: a mapped log's reserved tail).
//! Integers: little-endian groups of 7 bits in continuation bytes `0x80..=0xFF`, ended by
//! a final byte `0x10..=0x7F` carrying a value below 112. Strings (bind parameters): their
//! byte length, then the bytes with `\0`, `\n` and [`ESC`] escaped as [`ESC`] + one byte.

/// Marks a compact statement record (its line's first byte).
pub(super) const STATEMENT: u8 = b'S';
/// Marks a compact outcome record.
pub(super) const OUTCOME: u8 = b'O';
/// Marks a compact statement record carrying its text inline (a text seen for the first
/// time: most are never seen again, so a definition line would only cost more).
pub(super) const INLINE: u8 = b'T';
/// Inline texts longer than this (bytes) are not read (the writer cuts longer texts and
/// defines them, with their length and digest).
pub(super) const INLINE_MAX: usize = super::TEXT_MAX;
/// Escape byte inside strings.
const ESC: u8 = 0x0B;
/// Values below this in a reference name a word of [`WORDS`]; from it on, the file offset
/// of a definition line plus [`WORD_BASE`].
const WORD_BASE: u64 = 32;
/// Bind parameter values longer than this (bytes) are not read (the writer stores at most
/// 256 bytes of text and 32 bytes of binary as hex, plus a mark).
pub(super) const PARAM_MAX: usize = 4096;
/// More bind parameters than this are not read (the protocol allows 65535).
const PARAMS_MAX: u64 = 65_535;

/// Words referred to by number (fixed for format version 2: append only).
pub(super) const WORDS: [&str; 32] = [
    "simple",
    "extended",
    "function",
    "read",
    "write",
    "ddl",
    "transaction",
    "privilege",
    "utility",
    "unparsed",
    "SELECT",
    "INSERT 0",
    "UPDATE",
    "DELETE",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SET",
    "FETCH",
    "COPY",
    "MERGE",
    "SHOW",
    "CREATE TABLE",
    "DO",
    "SAVEPOINT",
    "RELEASE",
    "RESET",
    "DISCARD ALL",
    "DEALLOCATE",
    "EXPLAIN",
    "TRUNCATE TABLE",
    "PREPARE",
];

/// Longest word of [`WORDS`] + 1.
const WORD_LEN_MAX: usize = 16;

/// [`WORDS`] by first byte and length: index + 1 at `first * WORD_LEN_MAX + len`, 0 for
/// none. Built from the list, which it checks: no two words share first byte and length.
const WORD_SLOTS: [u8; 256 * WORD_LEN_MAX] = {
    let mut t = [0u8; 256 * WORD_LEN_MAX];
    let mut i = 0;
    while i < WORDS.len() {
        let w = WORDS[i].as_bytes();
        assert!(!w.is_empty() && w.len() < WORD_LEN_MAX);
        let at = w[0] as usize * WORD_LEN_MAX + w.len();
        assert!(t[at] == 0, "two words share their first byte and length");
        t[at] = i as u8 + 1;
        i += 1;
    }
    t
};

/// A text in a compact record: a fixed word, or the definition line at a file offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Ref {
    Word(u8),
    At(u64),
}

impl Ref {
    /// The word's number when `s` is one of [`WORDS`].
    pub(super) fn word(s: &str) -> Option<Ref> {
        // One candidate by first byte and length (no two words share both), then one
        // comparison: this runs for a statement's protocol and kind and an outcome's tag.
        let b = s.as_bytes();
        let slot = *WORD_SLOTS.get(usize::from(*b.first()?) * WORD_LEN_MAX + b.len())?;
        let i = usize::from(slot.checked_sub(1)?);
        (WORDS[i] == s).then_some(Ref::Word(i as u8))
    }

    fn code(self) -> u64 {
        match self {
            Ref::Word(i) => u64::from(i),
            Ref::At(off) => off.saturating_add(WORD_BASE),
        }
    }

    fn from_code(v: u64) -> Option<Ref> {
        if v < WORD_BASE {
            (v < WORDS.len() as u64).then_some(Ref::Word(v as u8))
        } else {
            Some(Ref::At(v - WORD_BASE))
        }
    }
}

/// A statement's text in its record: a reference, or the text itself.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Text<'a> {
    Ref(Ref),
    Inline(std::borrow::Cow<'a, str>),
}

/// A statement record with its texts as references (its statement text possibly inline).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Statement<'a> {
    pub seq: u64,
    /// Nanoseconds since the log's epoch (its header).
    pub ts: u64,
    pub session: u64,
    pub protocol: Ref,
    pub text: Text<'a>,
    pub kind: Ref,
}

/// An outcome record with its texts as references.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Outcome {
    pub seq: u64,
    pub ts: u64,
    pub rows: Option<u64>,
    pub capped: bool,
    pub micros: u64,
    pub sqlstate: Option<Ref>,
    /// The tag as a word and the number that ended it (`SELECT` and 200 for `SELECT 200`).
    pub tag: Option<(Ref, Option<u64>)>,
    pub skipped: bool,
    pub denied: bool,
    pub kind: Option<Ref>,
}

const F_ROWS: u64 = 1;
const F_CAPPED: u64 = 2;
const F_SQLSTATE: u64 = 4;
const F_TAG: u64 = 8;
const F_SKIPPED: u64 = 16;
const F_DENIED: u64 = 32;
const F_KIND: u64 = 64;

pub(super) fn put_v(out: &mut Vec<u8>, mut n: u64) {
    while n >= 112 {
        out.push(0x80 | (n & 0x7f) as u8);
        n >>= 7;
    }
    out.push(0x10 + n as u8);
}

/// Reads a compact line, field by field; every read is bounded by the line.
pub(super) struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(b: &'a [u8]) -> Self {
        Cursor { b, i: 0 }
    }

    fn byte(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    pub(super) fn v(&mut self) -> Option<u64> {
        let (mut n, mut shift) = (0u64, 0u32);
        loop {
            let c = self.byte()?;
            let (d, last) = match c {
                0x80..=0xff => (u64::from(c & 0x7f), false),
                0x10..=0x7f => (u64::from(c - 0x10), true),
                _ => return None,
            };
            if shift >= 64 || (d << shift) >> shift != d {
                return None;
            }
            n |= d << shift;
            if last {
                return Some(n);
            }
            shift += 7;
        }
    }

    fn r#ref(&mut self) -> Option<Ref> {
        Ref::from_code(self.v()?)
    }

    fn string(&mut self, max: usize) -> Option<String> {
        let len = usize::try_from(self.v()?).ok()?;
        if len > max {
            return None;
        }
        let mut s = Vec::with_capacity(len);
        while s.len() < len {
            match self.byte()? {
                ESC => s.push(match self.byte()? {
                    0x30 => 0,
                    0x31 => b'\n',
                    0x32 => ESC,
                    _ => return None,
                }),
                c => s.push(c),
            }
        }
        String::from_utf8(s).ok()
    }

    fn done(&self) -> bool {
        self.i == self.b.len()
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    put_v(out, s.len() as u64);
    let b = s.as_bytes();
    // Most strings need no escape: copied whole (memchr3 looks a word at a time, where a
    // byte loop made three comparisons per byte).
    let Some(first) = memchr::memchr3(0, b'\n', ESC, b) else {
        out.extend_from_slice(b);
        return;
    };
    out.extend_from_slice(&b[..first]);
    for &c in &b[first..] {
        match c {
            0 => out.extend_from_slice(&[ESC, 0x30]),
            b'\n' => out.extend_from_slice(&[ESC, 0x31]),
            ESC => out.extend_from_slice(&[ESC, 0x32]),
            _ => out.push(c),
        }
    }
}

/// Appends a statement record's line (with its newline).
pub(super) fn put_statement(out: &mut Vec<u8>, s: &Statement<'_>, params: &[Option<String>]) {
    out.push(match s.text {
        Text::Ref(_) => STATEMENT,
        Text::Inline(_) => INLINE,
    });
    put_v(out, s.seq);
    put_v(out, s.ts);
    put_v(out, s.session);
    put_v(out, s.protocol.code());
    match &s.text {
        Text::Ref(r) => put_v(out, r.code()),
        Text::Inline(t) => put_string(out, t),
    }
    put_v(out, s.kind.code());
    put_v(out, params.len() as u64);
    for p in params {
        match p {
            // 0: NULL; else 1 and the string.
            None => put_v(out, 0),
            Some(v) => {
                put_v(out, 1);
                put_string(out, v);
            }
        }
    }
    out.push(b'\n');
}

/// Appends an outcome record's line (with its newline).
pub(super) fn put_outcome(out: &mut Vec<u8>, o: &Outcome) {
    let flag = |on: bool, f: u64| if on { f } else { 0 };
    let flags = flag(o.rows.is_some(), F_ROWS)
        | flag(o.capped, F_CAPPED)
        | flag(o.sqlstate.is_some(), F_SQLSTATE)
        | flag(o.tag.is_some(), F_TAG)
        | flag(o.skipped, F_SKIPPED)
        | flag(o.denied, F_DENIED)
        | flag(o.kind.is_some(), F_KIND);
    out.push(OUTCOME);
    put_v(out, o.seq);
    put_v(out, o.ts);
    put_v(out, flags);
    put_v(out, o.micros);
    if let Some(n) = o.rows {
        put_v(out, n);
    }
    if let Some(r) = o.sqlstate {
        put_v(out, r.code());
    }
    if let Some((r, n)) = o.tag {
        put_v(out, r.code());
        put_v(out, n.map_or(0, |n| n.saturating_add(1)));
    }
    if let Some(r) = o.kind {
        put_v(out, r.code());
    }
    out.push(b'\n');
}

/// The record's kind and `seq` from a line's start (None: not a compact record).
pub(super) fn head(line: &[u8]) -> Option<(u8, u64)> {
    let (&mark, rest) = line.split_first()?;
    let mark = match mark {
        STATEMENT | INLINE => STATEMENT,
        OUTCOME => OUTCOME,
        _ => return None,
    };
    Some((mark, Cursor::new(rest).v()?))
}

/// A statement record (referring to its text or carrying it) and its parameters from its
/// line (without the newline); None when it does not decode whole (a torn or corrupt line).
pub(super) fn statement(line: &[u8]) -> Option<(Statement<'static>, Vec<Option<String>>)> {
    let (&mark, rest) = line.split_first()?;
    let mut c = Cursor::new(rest);
    let (seq, ts, session) = (c.v()?, c.v()?, c.v()?);
    let protocol = c.r#ref()?;
    let text = match mark {
        STATEMENT => Text::Ref(c.r#ref()?),
        INLINE => Text::Inline(c.string(INLINE_MAX)?.into()),
        _ => return None,
    };
    let kind = c.r#ref()?;
    let n = c.v()?;
    if n > PARAMS_MAX {
        return None;
    }
    let mut params = Vec::new();
    for _ in 0..n {
        params.push(match c.v()? {
            0 => None,
            1 => Some(c.string(PARAM_MAX)?),
            _ => return None,
        });
    }
    let s = Statement {
        seq,
        ts,
        session,
        protocol,
        text,
        kind,
    };
    c.done().then_some((s, params))
}

/// An outcome record from its line (without the newline); None when it does not decode.
pub(super) fn outcome(line: &[u8]) -> Option<Outcome> {
    let mut c = Cursor::new(line.strip_prefix(&[OUTCOME])?);
    let (seq, ts, flags, micros) = (c.v()?, c.v()?, c.v()?, c.v()?);
    if flags >= 128 {
        return None;
    }
    let on = |f: u64| flags & f != 0;
    let rows = if on(F_ROWS) { Some(c.v()?) } else { None };
    let sqlstate = if on(F_SQLSTATE) {
        Some(c.r#ref()?)
    } else {
        None
    };
    let tag = if on(F_TAG) {
        let r = c.r#ref()?;
        Some((r, c.v()?.checked_sub(1)))
    } else {
        None
    };
    let kind = if on(F_KIND) { Some(c.r#ref()?) } else { None };
    c.done().then_some(Outcome {
        seq,
        ts,
        rows,
        capped: on(F_CAPPED),
        micros,
        sqlstate,
        tag,
        skipped: on(F_SKIPPED),
        denied: on(F_DENIED),
        kind,
    })
}

/// A tag split into its words and the number ending it (`INSERT 0 5`: `INSERT 0`, 5), so
/// tags differing only in their count share one definition; only when joining them gives
/// the same tag back.
pub(super) fn split_tag(tag: &str) -> (&str, Option<u64>) {
    // The last space found byte-wise (`rsplit_once` with a char pattern costs a reverse
    // UTF-8 searcher per outcome record).
    let last_space = tag.as_bytes().iter().rposition(|&b| b == b' ');
    if let Some((words, digits)) = last_space.map(|i| (&tag[..i], &tag[i + 1..])) {
        let canonical = !digits.is_empty()
            && digits.len() <= 20
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if canonical {
            // u64::MAX has no room for the +1 of its encoding.
            if let Ok(n @ 0..=0xffff_ffff_ffff_fffe) = digits.parse::<u64>() {
                return (words, Some(n));
            }
        }
    }
    (tag, None)
}

/// The tag back from [`split_tag`]'s parts.
pub(super) fn join_tag(words: &str, n: Option<u64>) -> String {
    match n {
        Some(n) => format!("{words} {n}"),
        None => words.to_string(),
    }
}

#[cfg(test)]
mod tests;
