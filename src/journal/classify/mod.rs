//! Statement kinds for the log, and the lexical splitting the relay needs. Classification
//! never blocks or alters a statement; results are cached by text so the parser stays off
//! the hot path for repeated statements.

use std::cell::RefCell;
use std::sync::OnceLock;

use dashmap::DashMap;
use sqlparser::ast::{SetExpr, Statement};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

mod reading;
mod words;
#[cfg(test)]
use words::{first_word_is, first_word_upper, leading_words};
pub use words::{
    from_keywords, leading_word_is, may_read_catalogs, may_return_rows, returning, rows_and_copy,
};

/// What a statement does, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Reads only.
    Read,
    /// Changes rows.
    Write,
    /// Changes schema.
    Ddl,
    /// Transaction control.
    Transaction,
    /// Roles and grants.
    Privilege,
    /// Settings, maintenance, session utilities.
    Utility,
    /// Not understood (DO blocks and the like).
    Unparsed,
}

impl Kind {
    /// The word used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Ddl => "ddl",
            Kind::Transaction => "transaction",
            Kind::Privilege => "privilege",
            Kind::Utility => "utility",
            Kind::Unparsed => "unparsed",
        }
    }
}

const CACHE_MAX: usize = 10_000;
/// Most statements a split gives: a text with more is unsplittable (judged as one, which a
/// policy refuses) and its ranges never take more than this bound's memory.
pub const MAX_STATEMENTS: usize = 1_000;
const PARSE_MAX: usize = 64 * 1024;

/// Classify one statement (cached by its text with literal values blanked, so statements
/// that differ only in their constants parse once). A text the server may read otherwise
/// ([`reading`]) is `Unparsed`.
pub fn classify(text: &str) -> Kind {
    static CACHE: OnceLock<DashMap<String, Kind>> = OnceLock::new();
    thread_local! {
        /// The shape buffer (reused: no allocation per statement) and the last shape looked
        /// up with its kind: a session repeating a statement skips the shared map's hashing
        /// and locking. Only a cache; the kind is a function of the shape.
        static LAST: RefCell<(String, String, Option<Kind>)> = const {
            RefCell::new((String::new(), String::new(), None))
        };
    }
    if text.len() > 4096 {
        if reading::ambiguous(text) {
            return Kind::Unparsed;
        }
        return classify_uncached(text);
    }
    let cache = CACHE.get_or_init(DashMap::new);
    let found = LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return None;
        };
        let (shape, last_key, last_kind) = &mut *last;
        let key = if literal_shape_into(text, shape) {
            // A shape means no backslash anywhere: one reading only.
            shape.as_str()
        } else if reading::ambiguous(text) {
            return Some(Kind::Unparsed);
        } else {
            text
        };
        if let Some(k) = last_kind.filter(|_| last_key.as_str() == key) {
            return Some(k);
        }
        let k = cache.get(key).map(|k| *k)?;
        last_key.clear();
        last_key.push_str(key);
        *last_kind = Some(k);
        Some(k)
    });
    if let Some(k) = found {
        return k;
    }
    if reading::ambiguous(text) {
        return Kind::Unparsed; // the thread's entry was busy, or a cache miss
    }
    let shaped = literal_shape(text);
    let key = shaped.as_deref().unwrap_or(text);
    let k = classify_uncached(text);
    if cache.len() >= CACHE_MAX {
        cache.clear(); // crude but bounded; statement texts repeat in bursts
    }
    cache.insert(key.to_string(), k);
    k
}

/// The text with every plain string literal replaced by `''` and every number by `0`; the
/// kind of a statement never depends on those values. None (use the exact text) when the
/// text has anything a simple scan could misread as a literal boundary: backslashes (E''
/// strings), dollar quoting, comments, or no literal at all.
fn literal_shape(text: &str) -> Option<String> {
    let mut out = String::new();
    literal_shape_into(text, &mut out).then_some(out)
}

/// [`literal_shape`] into a reused buffer: true when `out` holds the shape, false for None.
///
/// One pass: every byte is looked at by exactly one branch below, and each branch gives up
/// (false) at a `--`, a `/*` or a backslash, wherever it is (in a literal too), as the
/// separate scans for them before did.
fn literal_shape_into(text: &str, out: &mut String) -> bool {
    out.clear();
    let b = text.as_bytes();
    out.reserve(text.len());
    let mut changed = false;
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    // A comment opener or a backslash at `k`: the shape cannot be trusted.
    let untrusted_at = |k: usize| match b[k] {
        b'\\' => true,
        b'-' => b.get(k + 1) == Some(&b'-'),
        b'/' => b.get(k + 1) == Some(&b'*'),
        _ => false,
    };
    while i < b.len() {
        let c = b[i];
        if c == b'$' {
            if !b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                return false; // dollar quoting
            }
            // A parameter ($1): keep it and its digits.
            let end = i + 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            out.push_str(&text[i..end]);
            i = end;
        } else if c == b'\'' {
            let mut j = i + 1;
            loop {
                match b.get(j) {
                    None => return false, // unterminated: leave it to the parser
                    Some(b'\'') if b.get(j + 1) == Some(&b'\'') => j += 2,
                    Some(b'\'') => break,
                    Some(_) if untrusted_at(j) => return false,
                    Some(_) => j += 1,
                }
            }
            out.push_str("''");
            changed = true;
            i = j + 1;
        } else if c == b'"' {
            let mut j = i + 1;
            loop {
                match b.get(j) {
                    None => return false,
                    Some(b'"') => break,
                    Some(_) if untrusted_at(j) => return false,
                    Some(_) => j += 1,
                }
            }
            out.push_str(&text[i..=j]);
            i = j + 1;
        } else if c.is_ascii_digit() && (i == 0 || !ident(b[i - 1])) {
            let end = i + b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            out.push('0');
            changed = true;
            i = end;
        } else {
            // Copy up to the next byte that may start a literal; every stop is an ASCII
            // byte, so both slice ends are char boundaries.
            let mut end = i;
            while end < b.len() {
                let c = b[end];
                if SHAPE_STOP[usize::from(c)] {
                    if untrusted_at(end) {
                        return false;
                    }
                    if c == b'$'
                        || c == b'\''
                        || c == b'"'
                        || (end > i && c.is_ascii_digit() && !ident(b[end - 1]))
                    {
                        break;
                    }
                }
                end += 1;
            }
            out.push_str(&text[i..end]);
            i = end;
        }
    }
    changed
}

/// Bytes the shape's copy loop must look at: where a literal, a parameter or dollar quoting
/// may start, or a comment or backslash may be.
const SHAPE_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = b'0';
    while c <= b'9' {
        t[c as usize] = true;
        c += 1;
    }
    t[b'$' as usize] = true;
    t[b'\'' as usize] = true;
    t[b'"' as usize] = true;
    t[b'-' as usize] = true;
    t[b'/' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

fn classify_uncached(text: &str) -> Kind {
    if text.len() <= PARSE_MAX {
        if let Ok(stmts) = Parser::parse_sql(&PostgreSqlDialect {}, text) {
            match stmts.as_slice() {
                [s] => return from_ast(s),
                // Several statements the splitter could not part (a `BEGIN ATOMIC` body,
                // past MAX_STATEMENTS): the first one's kind would say nothing of the rest.
                [_, _, ..] => return Kind::Unparsed,
                [] => {}
            }
        }
    }
    // The first words say nothing of a second statement: only a text the splitter reads as
    // one statement (a `;` inside its strings is fine) is judged by them.
    let mut ranges = Vec::new();
    if !split_ranges(text, &mut ranges) || ranges.len() > 1 {
        return Kind::Unparsed;
    }
    from_keywords(text)
}

fn query_kind(q: &sqlparser::ast::Query) -> Kind {
    let writes = |b: &SetExpr| {
        matches!(
            b,
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_) | SetExpr::Merge(_)
        )
    };
    if let Some(with) = &q.with {
        if with.cte_tables.iter().any(|c| writes(&c.query.body)) {
            return Kind::Write;
        }
    }
    if writes(&q.body) {
        return Kind::Write;
    }
    if let SetExpr::Select(s) = q.body.as_ref() {
        if s.into.is_some() {
            return Kind::Ddl; // SELECT … INTO creates a table
        }
    }
    Kind::Read
}

fn from_ast(s: &Statement) -> Kind {
    use Statement as S;
    match s {
        S::Query(q) => query_kind(q),
        S::Insert(_) | S::Update { .. } | S::Delete(_) | S::Merge { .. } | S::Truncate { .. } => {
            Kind::Write
        }
        S::Copy { to, source, .. } => match (to, source) {
            // `COPY (DELETE … RETURNING …) TO STDOUT` writes.
            (true, sqlparser::ast::CopySource::Query(q)) => query_kind(q),
            (true, _) => Kind::Read,
            (false, _) => Kind::Write,
        },
        S::Explain {
            statement,
            analyze,
            options,
            ..
        } => {
            // `EXPLAIN ANALYZE` and `EXPLAIN (ANALYZE …)` run the statement.
            let analyzing = *analyze
                || options.iter().flatten().any(|o| {
                    let name = o.name.value.to_ascii_uppercase();
                    let off = o.arg.as_ref().is_some_and(|a| {
                        matches!(
                            a.to_string().to_ascii_lowercase().trim_matches('\''),
                            "false" | "off" | "0" | "no"
                        )
                    });
                    (name == "ANALYZE" || name == "ANALYSE") && !off
                });
            if analyzing {
                from_ast(statement)
            } else {
                Kind::Read
            }
        }
        S::ShowVariable { .. }
        | S::ShowVariables { .. }
        | S::Fetch { .. }
        | S::Declare { .. }
        | S::Close { .. } => Kind::Read,
        S::StartTransaction { .. }
        | S::Commit { .. }
        | S::Rollback { .. }
        | S::Savepoint { .. }
        | S::ReleaseSavepoint { .. } => Kind::Transaction,
        S::Set(set) => match set {
            sqlparser::ast::Set::SetTransaction { .. } => Kind::Transaction,
            sqlparser::ast::Set::SetRole { .. } => Kind::Privilege,
            _ => from_keywords(&s.to_string()),
        },
        // PREPARE runs nothing yet, but what it prepares is what EXECUTE will run.
        S::Prepare { statement, .. } => match from_ast(statement) {
            Kind::Read => Kind::Utility,
            k => k,
        },
        // Runs a statement the server holds under that name: nothing in this text says what.
        S::Execute { .. } => Kind::Unparsed,
        S::Grant { .. } | S::Revoke { .. } | S::CreateRole { .. } | S::AlterRole { .. } => {
            Kind::Privilege
        }
        S::Drop {
            object_type: sqlparser::ast::ObjectType::Role,
            ..
        } => Kind::Privilege,
        S::Discard { .. }
        | S::Deallocate { .. }
        | S::LISTEN { .. }
        | S::UNLISTEN { .. }
        | S::NOTIFY { .. }
        | S::Analyze { .. }
        | S::Call(_)
        | S::Kill { .. } => Kind::Utility,
        _ => {
            let name = format!("{s:?}");
            if name.starts_with("Create")
                || name.starts_with("Alter")
                || name.starts_with("Drop")
                || name.starts_with("Comment")
            {
                Kind::Ddl
            } else {
                from_keywords(&s.to_string())
            }
        }
    }
}

/// A byte that can continue an identifier or a dollar-quote tag (letters, digits, `_`, and
/// any byte of a non-ASCII character).
pub(crate) fn ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Split a simple-query string into statements (byte ranges, trimmed, empty ones dropped),
/// honouring quotes, dollar quotes, identifiers and comments. Returns None when the text
/// has a construct whose semicolons do not end statements (`BEGIN ATOMIC` bodies) or is
/// not closed, so the caller treats it as one unsplittable statement.
pub fn split(text: &str) -> Option<Vec<&str>> {
    let mut ranges = Vec::new();
    split_ranges(text, &mut ranges).then(|| ranges.into_iter().map(|r| &text[r]).collect())
}

/// [`split`] into a reused list of byte ranges of `text` (no allocation per query once the
/// list has grown): false where `split` gives None (`out` then holds nothing useful), and
/// for a text the server may read otherwise than the gateway ([`reading::ambiguous`]).
pub fn split_ranges(text: &str, out: &mut Vec<std::ops::Range<usize>>) -> bool {
    let mut quoted_backslash = false;
    let split = scan(text, false, out, None, &mut quoted_backslash);
    // Two readings part only at a backslash inside a string, so only such a text is checked.
    if quoted_backslash && reading::ambiguous(text) {
        out.clear();
        return false;
    }
    split
}

/// The lexer behind [`split_ranges`]: `plain_escapes` reads a backslash in a plain `'…'`
/// string as an escape (the server's `standard_conforming_strings = off`); `marks`, when
/// given, hashes the end of every quoted token and comment, so two readings can be compared;
/// `quoted_backslash` is set when a `'…'` string holds a backslash.
fn scan(
    text: &str,
    plain_escapes: bool,
    out: &mut Vec<std::ops::Range<usize>>,
    mut marks: Option<&mut std::collections::hash_map::DefaultHasher>,
    quoted_backslash: &mut bool,
) -> bool {
    out.clear();
    let mut mark = |at: usize| {
        if let Some(m) = marks.as_deref_mut() {
            std::hash::Hasher::write_usize(m, at);
        }
    };
    // A trimmed piece's range within `text` (trimming only moves the ends inward).
    let range_of = |piece: &str| {
        let at = piece.as_ptr() as usize - text.as_ptr() as usize;
        at..at + piece.len()
    };
    let b = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        // Runs of bytes that start nothing (most of a statement) are passed a word at a time.
        i = skip_words(b, i, |x| {
            has_byte(x, b'\'')
                | has_byte(x, b'"')
                | has_byte(x, b'-')
                | has_byte(x, b'/')
                | has_byte(x, b'$')
                | has_byte(x, b';')
        });
        let Some(&c) = b.get(i) else { break };
        match c {
            b'\'' => {
                // E'…' only where the E starts a token (`abcE'x'` is identifier `abce`
                // followed by a standard string), as in PostgreSQL's scanner.
                let escapes = plain_escapes
                    || (i > 0
                        && (b[i - 1] == b'E' || b[i - 1] == b'e')
                        && !(i > 1 && ident_byte(b[i - 2])));
                i += 1;
                loop {
                    match b.get(i) {
                        None => return false,
                        Some(b'\\') => {
                            *quoted_backslash = true;
                            i += if escapes { 2 } else { 1 };
                        }
                        Some(b'\'') if b.get(i + 1) == Some(&b'\'') => i += 2,
                        Some(b'\'') => break,
                        Some(_) => i += 1,
                    }
                }
                mark(i);
            }
            b'"' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None => return false,
                        Some(b'"') if b.get(i + 1) == Some(&b'"') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
                mark(i);
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                // A comment ends at a newline: \n or \r, as PostgreSQL's scanner has it.
                while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
                mark(i);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 1;
                i += 2;
                while depth > 0 {
                    match (b.get(i), b.get(i + 1)) {
                        (None, _) => return false,
                        (Some(b'/'), Some(b'*')) => {
                            depth += 1;
                            i += 2;
                        }
                        (Some(b'*'), Some(b'/')) => {
                            depth -= 1;
                            i += 2;
                        }
                        _ => i += 1,
                    }
                }
                mark(i);
                continue;
            }
            b'$' => {
                // $tag$ … $tag$ (a `$1` parameter is not a quote).
                // Inside an identifier (`a$b`, or after a non-ASCII letter) `$` is part of it.
                let prev_ident = i > 0 && (ident_byte(b[i - 1]) || b[i - 1] == b'$');
                let tag_end = b[i + 1..]
                    .iter()
                    .position(|&c| !ident_byte(c))
                    .map(|p| i + 1 + p);
                if let Some(te) = tag_end {
                    let tag = &b[i..=te];
                    let valid = !prev_ident
                        && b[te] == b'$'
                        && !tag[1..tag.len() - 1]
                            .first()
                            .is_some_and(|c| c.is_ascii_digit());
                    if valid {
                        let body_start = te + 1;
                        let Some(close) = b[body_start..].windows(tag.len()).position(|w| w == tag)
                        else {
                            return false;
                        };
                        i = body_start + close + tag.len();
                        mark(i);
                        continue;
                    }
                }
            }
            b';' => {
                let piece = text[start..i].trim();
                if !piece.is_empty() {
                    if out.len() >= MAX_STATEMENTS {
                        return false; // one more would pass the bound: unsplittable
                    }
                    out.push(range_of(piece));
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let piece = text[start..].trim();
    if !piece.is_empty() {
        if out.len() >= MAX_STATEMENTS {
            return false;
        }
        out.push(range_of(piece));
    }
    // Looked for without upper-casing a copy (this runs for every simple query).
    !out.iter().any(|r| begin_atomic(&b[r.clone()]))
}

/// Whether `b` holds `BEGIN ATOMIC` or `BEGIN\nATOMIC` in any case.
fn begin_atomic(b: &[u8]) -> bool {
    let mut i = 0;
    loop {
        // `c | 0x20 == b'b'` only for `B` and `b`.
        i = skip_words(b, i, |x| has_byte(x | (ONES * 0x20), b'b'));
        let Some(&c) = b.get(i) else { return false };
        let found = (c == b'B' || c == b'b')
            && b.get(i..i + 12).is_some_and(|w| {
                w[..5].eq_ignore_ascii_case(b"BEGIN")
                    && (w[5] == b' ' || w[5] == b'\n')
                    && w[6..].eq_ignore_ascii_case(b"ATOMIC")
            });
        if found {
            return true;
        }
        i += 1;
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;

/// The lanes of the word `x` whose byte is `c`, as their high bits: exact for the lowest
/// such lane (a borrow can only mark lanes above a real match), which is all
/// [`skip_words`] uses.
fn has_byte(x: u64, c: u8) -> u64 {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let y = x ^ (ONES * u64::from(c));
    y.wrapping_sub(ONES) & !y & HIGH
}

/// From `i`, the first byte of `b` that `stop` marks (`stop` gives a word's marked lanes,
/// see [`has_byte`]), or the start of the last run shorter than a word: every byte before
/// it is one `stop` does not mark, so a byte loop that does nothing on those may go on
/// from there.
fn skip_words(b: &[u8], mut i: usize, stop: impl Fn(u64) -> u64) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let marked = stop(u64::from_le_bytes(word));
        if marked != 0 {
            return i + (marked.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i
}

#[cfg(test)]
mod tests;
