//! The writer's side of format version 2: the log's header line, and each distinct text
//! (statement text, tag words, SQLSTATE, unusual kinds) written once as a definition line
//! that compact records refer to by its file offset (so a reader resolves a reference with
//! one read, from anywhere in the file, with no index). Anything a compact record cannot
//! hold exactly (another token's record, a time in another shape) is written as a JSON line.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use foldhash::fast::SeedableRandomState;
use foldhash::SharedSeed;
use rand::RngCore;

use super::compact::{self, Ref, Text};
use super::line::{self, cut_text, put_str, OutcomeRef, StatementRef};

/// Bytes of distinct texts a log remembers (per token, in memory); texts past it are
/// carried inline at each use (still correct, only longer). Bounds what an agent sending only
/// distinct texts makes the gateway hold.
const DICT_MAX: usize = 8 << 20;
/// Slots of the table of texts seen once (their hashes; 64 KiB per log, made at the first
/// new text): a text is defined at its second use only while its first is remembered.
const SEEN_SLOTS: usize = 8192;

/// Hashes the dictionary's keys are already (keyed hash of the text, computed once per
/// statement): used as they are, so an agent cannot aim texts at one bucket either.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The text hasher: foldhash (a fraction of SipHash's instructions on a statement-sized
/// text, hashed once per statement on the relay's path), keyed from the OS's randomness
/// rather than foldhash's default of addresses and the clock: its shared seed is what stops
/// an agent crafting texts that collide whatever the per-log seed is. A collision costs
/// only compression (the text is then carried inline), never a wrong reference.
fn text_hasher() -> SeedableRandomState {
    static SHARED: OnceLock<SharedSeed> = OnceLock::new();
    let shared = SHARED.get_or_init(|| SharedSeed::from_u64(rand::rngs::OsRng.next_u64()));
    SeedableRandomState::with_seed(rand::rngs::OsRng.next_u64(), shared)
}

/// A defined text: the text (to tell hash collisions apart) and its definition's offset.
type Entry = (Box<str>, u64);

/// A version 2 log's writing state.
pub(super) struct Interner {
    /// Unix nanoseconds that record times count from.
    epoch: u64,
    token: String,
    task: String,
    hasher: SeedableRandomState,
    /// Hash of a text to the text and the offset of its definition line.
    dict: HashMap<u64, Entry, BuildHasherDefault<Prehashed>>,
    dict_bytes: usize,
    /// Hashes of texts seen once, by `hash % SEEN_SLOTS` (0: none).
    seen: Vec<u64>,
    /// The last statement text that had a definition, and the definition's offset: a
    /// repeated statement skips the hash. Its buffer is reused.
    last: String,
    last_off: Option<u64>,
}

impl Interner {
    pub(super) fn new(token: &str, task: &str, epoch: u64) -> Interner {
        Interner {
            epoch,
            token: token.to_string(),
            task: task.to_string(),
            hasher: text_hasher(),
            dict: HashMap::default(),
            dict_bytes: 0,
            seen: Vec::new(),
            last: String::new(),
            last_off: None,
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
        self.last_off = None;
    }

    fn ts(&self, ts: Option<&str>) -> Option<u64> {
        let ns = match ts {
            None => line::now_ns(),
            Some(t) => line::time_ns(t)?,
        };
        ns.checked_sub(self.epoch)
    }

    /// Appends the definition line of `text` to `out` (whose first byte lands at file offset
    /// `at`); its offset.
    fn define(out: &mut Vec<u8>, at: u64, text: &str, cut: Option<&(u64, String)>) -> u64 {
        let off = at + out.len() as u64;
        out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
        put_str(out, text);
        if let Some((len, sha)) = cut {
            out.extend_from_slice(
                format!(",\"text_len\":{len},\"text_sha256\":\"{sha}\"").as_bytes(),
            );
        }
        out.extend_from_slice(b"}\n");
        off
    }

    /// Remembers `text`'s definition at `off` (while the dictionary has room).
    fn remember(&mut self, h: u64, text: &str, off: u64) {
        if self.dict_bytes + text.len() <= DICT_MAX {
            self.dict_bytes += text.len();
            self.dict.insert(h, (text.into(), off));
        }
    }

    /// A word's reference (tag words, SQLSTATEs, unusual kinds: few and repeated, so
    /// defined at their first use), appending its definition when it has none yet.
    #[inline]
    fn word_ref(&mut self, out: &mut Vec<u8>, at: u64, w: &str, defined: &mut bool) -> Ref {
        // The fixed words (every protocol and kind, the common tags) without a call.
        match Ref::word(w) {
            Some(r) => r,
            None => self.defined_word_ref(out, at, w, defined),
        }
    }

    /// [`Interner::word_ref`] of a word that is not one of the fixed ones.
    #[inline(never)]
    fn defined_word_ref(&mut self, out: &mut Vec<u8>, at: u64, w: &str, defined: &mut bool) -> Ref {
        let h = self.hasher.hash_one(w);
        match self.dict.get(&h) {
            Some((t, off)) if **t == *w => Ref::At(*off),
            found => {
                let collides = found.is_some();
                let off = Self::define(out, at, w, None);
                *defined = true;
                if !collides {
                    self.remember(h, w, off);
                }
                Ref::At(off)
            }
        }
    }

    /// A statement text in its record: a reference to its definition, or the text inline
    /// when it is seen for the first time (most such texts never come back: a definition
    /// would cost bytes, an allocation and a hash for nothing). At its second use it is
    /// defined (in `out`, first byte at offset `at`; `defined` then true). One hash per
    /// statement, none when it repeats the last one.
    fn text<'t>(
        &mut self,
        out: &mut Vec<u8>,
        at: u64,
        text: &'t str,
        defined: &mut bool,
    ) -> Text<'t> {
        if let Some(off) = self.last_off {
            if self.last == text {
                return Text::Ref(Ref::At(off));
            }
        }
        let h = self.hasher.hash_one(text);
        let off = match self.dict.get(&h) {
            Some((t, off)) if **t == *text => *off,
            // Another text with this hash (or a full dictionary): inline, always correct.
            Some(_) => return Text::Inline(text.into()),
            None if self.dict_bytes + text.len() > DICT_MAX => return Text::Inline(text.into()),
            None => {
                if self.seen.is_empty() {
                    self.seen = vec![0; SEEN_SLOTS];
                }
                let mark = h | 1;
                let slot = &mut self.seen[(h % SEEN_SLOTS as u64) as usize];
                if *slot != mark {
                    *slot = mark;
                    return Text::Inline(text.into());
                }
                *slot = 0;
                let off = Self::define(out, at, text, None);
                *defined = true;
                self.remember(h, text, off);
                off
            }
        };
        self.last.clear();
        self.last.push_str(text);
        self.last_off = Some(off);
        Text::Ref(Ref::At(off))
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
        let text = match &cut {
            // A cut text keeps its length and hash in a definition (rare: over 64 KiB).
            Some(c) => {
                defined = true;
                Text::Ref(Ref::At(Self::define(out, at, text, Some(c))))
            }
            None => self.text(out, at, text, &mut defined),
        };
        let kind = self.word_ref(out, at, s.kind, &mut defined);
        let rec = compact::Statement {
            seq: s.seq,
            ts,
            session: s.session,
            protocol,
            text,
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
