//! Statement kinds for the log, and the lexical splitting the relay needs. Classification
//! never blocks or alters a statement; results are cached by text so the parser stays off
//! the hot path for repeated statements.

use std::sync::OnceLock;

use dashmap::DashMap;
use sqlparser::ast::{SetExpr, Statement};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

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
const PARSE_MAX: usize = 64 * 1024;

/// Classify one statement (cached by its text with literal values blanked, so statements
/// that differ only in their constants parse once).
pub fn classify(text: &str) -> Kind {
    static CACHE: OnceLock<DashMap<String, Kind>> = OnceLock::new();
    let cache = CACHE.get_or_init(DashMap::new);
    if text.len() > 4096 {
        return classify_uncached(text);
    }
    let key = literal_shape(text);
    let key = key.as_deref().unwrap_or(text);
    if let Some(k) = cache.get(key) {
        return *k;
    }
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
    let b = text.as_bytes();
    if text.contains("--") || text.contains("/*") || b.contains(&b'\\') {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
    while i < b.len() {
        let c = b[i];
        if c == b'$' {
            if !b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                return None; // dollar quoting
            }
            // A parameter ($1): keep it and its digits.
            let end = i + 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            out.push_str(&text[i..end]);
            i = end;
        } else if c == b'\'' {
            let mut j = i + 1;
            loop {
                match b.get(j) {
                    None => return None, // unterminated: leave it to the parser
                    Some(b'\'') if b.get(j + 1) == Some(&b'\'') => j += 2,
                    Some(b'\'') => break,
                    Some(_) => j += 1,
                }
            }
            out.push_str("''");
            changed = true;
            i = j + 1;
        } else if c == b'"' {
            let end = i + 1 + b[i + 1..].iter().position(|&c| c == b'"')? + 1;
            out.push_str(&text[i..end]);
            i = end;
        } else if c.is_ascii_digit() && (i == 0 || !ident(b[i - 1])) {
            let end = i + b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
            out.push('0');
            changed = true;
            i = end;
        } else {
            // Copy up to the next byte that may start a literal; every stop is an ASCII
            // byte, so both slice ends are char boundaries.
            let mut end = i + 1;
            while end < b.len() {
                let c = b[end];
                if c == b'$'
                    || c == b'\''
                    || c == b'"'
                    || (c.is_ascii_digit() && !ident(b[end - 1]))
                {
                    break;
                }
                end += 1;
            }
            out.push_str(&text[i..end]);
            i = end;
        }
    }
    changed.then_some(out)
}

fn classify_uncached(text: &str) -> Kind {
    if text.len() <= PARSE_MAX {
        if let Ok(stmts) = Parser::parse_sql(&PostgreSqlDialect {}, text) {
            if let Some(s) = stmts.first() {
                return from_ast(s);
            }
        }
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
        S::Grant { .. } | S::Revoke { .. } | S::CreateRole { .. } | S::AlterRole { .. } => {
            Kind::Privilege
        }
        S::Drop { object_type, .. } if matches!(object_type, sqlparser::ast::ObjectType::Role) => {
            Kind::Privilege
        }
        S::Discard { .. }
        | S::Deallocate { .. }
        | S::Prepare { .. }
        | S::Execute { .. }
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

/// The first `n` words of a statement, upper-cased, skipping comments and parentheses.
fn leading_words(text: &str, n: usize) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = text.char_indices().peekable();
    let bytes = text.as_bytes();
    while let Some((i, c)) = chars.next() {
        if words.len() >= n {
            break;
        }
        if c == '-' && bytes.get(i + 1) == Some(&b'-') {
            for (_, c) in chars.by_ref() {
                if c == '\n' {
                    break;
                }
            }
        } else if c == '/' && bytes.get(i + 1) == Some(&b'*') {
            let mut depth = 0usize;
            let mut prev = '\0';
            for (_, c) in chars.by_ref() {
                if prev == '/' && c == '*' {
                    depth += 1;
                    prev = '\0';
                    continue;
                }
                if prev == '*' && c == '/' {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                    prev = '\0';
                    continue;
                }
                prev = c;
            }
        } else if c.is_alphabetic() || c == '_' {
            let mut w = String::new();
            w.push(c.to_ascii_uppercase());
            while let Some(&(_, c2)) = chars.peek() {
                if c2.is_alphanumeric() || c2 == '_' {
                    w.push(c2.to_ascii_uppercase());
                    chars.next();
                } else {
                    break;
                }
            }
            words.push(w);
        } else if c.is_whitespace() || c == '(' {
            continue;
        } else {
            break;
        }
    }
    words
}

/// What a byte-level look at a statement's start found.
enum FirstWord<'a> {
    /// The first word, as written (ASCII).
    Word(&'a str),
    /// No word starts the statement.
    None,
    /// A comment or non-ASCII text comes first: `leading_words` decides.
    Slow,
}

/// The first word without allocating, in the common case: after ASCII whitespace and
/// parentheses, an ASCII word. Anything else goes to `leading_words`, so both agree.
fn first_word_fast(text: &str) -> FirstWord<'_> {
    let b = text.as_bytes();
    let Some(start) = b
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b'('))
    else {
        return FirstWord::None;
    };
    let c = b[start];
    if !(c.is_ascii_alphabetic() || c == b'_') {
        return if c >= 0x80 || c == b'-' || c == b'/' {
            FirstWord::Slow
        } else {
            FirstWord::None
        };
    }
    let len = b[start..]
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
        .unwrap_or(b.len() - start);
    if b.get(start + len).is_some_and(|c| *c >= 0x80) {
        return FirstWord::Slow; // a word that goes on in non-ASCII letters
    }
    // Both ends are ASCII bytes, so char boundaries.
    text.get(start..start + len)
        .map_or(FirstWord::Slow, FirstWord::Word)
}

/// The statement's first word as `leading_words(text, 1)` finds it, compared without case.
fn first_word_is(text: &str, word: &str) -> bool {
    match first_word_fast(text) {
        FirstWord::Word(w) => w.eq_ignore_ascii_case(word),
        FirstWord::None => false,
        FirstWord::Slow => leading_words(text, 1)
            .first()
            .is_some_and(|l| l.eq_ignore_ascii_case(word)),
    }
}

/// The statement's first word upper-cased into `buf` ("" when there is none; "?" when it
/// is longer than any keyword), without allocating in the common case.
fn first_word_upper<'b>(text: &str, buf: &'b mut [u8; 16]) -> &'b str {
    let slow;
    let w: &str = match first_word_fast(text) {
        FirstWord::Word(w) => w,
        FirstWord::None => return "",
        FirstWord::Slow => {
            slow = leading_words(text, 1);
            match slow.first() {
                Some(w) => w.as_str(),
                None => return "",
            }
        }
    };
    let Some(dst) = buf.get_mut(..w.len()) else {
        return "?";
    };
    dst.copy_from_slice(w.as_bytes());
    dst.make_ascii_uppercase();
    std::str::from_utf8(dst).unwrap_or("?")
}

/// Whether `text` holds `word` (an upper-case ASCII word) in any case, without allocating.
fn contains_upper(text: &str, word: &[u8]) -> bool {
    text.as_bytes()
        .windows(word.len())
        .any(|w| w.eq_ignore_ascii_case(word))
}

/// Keyword fallback for what the parser does not understand.
pub fn from_keywords(text: &str) -> Kind {
    let w = leading_words(text, 2);
    let first = w.first().map(String::as_str).unwrap_or("");
    let second = w.get(1).map(String::as_str).unwrap_or("");
    match first {
        "SELECT" | "VALUES" | "TABLE" | "SHOW" | "FETCH" | "MOVE" | "DECLARE" | "CLOSE" => {
            Kind::Read
        }
        "WITH" => Kind::Read,
        "INSERT" | "UPDATE" | "DELETE" | "MERGE" | "TRUNCATE" | "COPY" => Kind::Write,
        "CREATE" | "ALTER" | "DROP" | "COMMENT" | "REINDEX" | "CLUSTER" | "REFRESH"
        | "SECURITY" | "IMPORT" => {
            if first == "ALTER" && second == "SYSTEM" {
                Kind::Utility
            } else if matches!(second, "ROLE" | "USER" | "GROUP") {
                Kind::Privilege
            } else {
                Kind::Ddl
            }
        }
        "BEGIN" | "START" | "COMMIT" | "END" | "ROLLBACK" | "ABORT" | "SAVEPOINT" | "RELEASE"
        | "PREPARE"
            if first != "PREPARE" || second == "TRANSACTION" =>
        {
            Kind::Transaction
        }
        "GRANT" | "REVOKE" | "REASSIGN" => Kind::Privilege,
        "SET" | "RESET" if matches!(second, "ROLE" | "SESSION") => Kind::Privilege,
        "SET" | "RESET" | "VACUUM" | "ANALYZE" | "ANALYSE" | "CHECKPOINT" | "LISTEN"
        | "UNLISTEN" | "NOTIFY" | "DISCARD" | "DEALLOCATE" | "PREPARE" | "EXECUTE" | "LOAD"
        | "LOCK" | "CALL" | "EXPLAIN" => Kind::Utility,
        _ => Kind::Unparsed,
    }
}

/// Whether a statement may read system catalogs (it names `pg_…` or
/// `information_schema`): the backend is then not stopped at the row cap, so that a
/// driver's own catalog query can be recognised from its RowDescription and passed whole.
/// A wrong guess only costs the early stop: rows are still capped from the stream.
pub fn may_read_catalogs(text: &str) -> bool {
    // Looked for at each `_` only: this runs for every statement on the hot path.
    let b = text.as_bytes();
    b.iter().enumerate().any(|(i, &c)| {
        c == b'_'
            && ((i >= 2 && b[i - 2..i].eq_ignore_ascii_case(b"pg"))
                || (i >= 11
                    && b[i - 11..i].eq_ignore_ascii_case(b"information")
                    && b.get(i + 1..i + 7)
                        .is_some_and(|w| w.eq_ignore_ascii_case(b"schema"))))
    })
}

/// Whether the statement's first word (after comments and parentheses) is `word`.
pub fn leading_word_is(text: &str, word: &str) -> bool {
    // Cheap rejections first (no allocation): the text must start with the word's first
    // letter or with what `leading_words` skips (comment, parenthesis), and hold the word.
    let (b, w) = (text.as_bytes(), word.as_bytes());
    match text.trim_start().as_bytes().first() {
        Some(c) if w.first().is_some_and(|f| c.eq_ignore_ascii_case(f)) => {}
        Some(b'(' | b'/' | b'-') => {}
        _ => return false,
    }
    let Some(&first) = w.first() else {
        return false;
    };
    let occurs = b.iter().enumerate().any(|(i, &c)| {
        c.eq_ignore_ascii_case(&first)
            && b.get(i..i + w.len())
                .is_some_and(|x| x.eq_ignore_ascii_case(w))
    });
    if !occurs {
        return false;
    }
    first_word_is(text, word)
}

/// Whether a statement can produce a result set (so it must be capped by the backend, not
/// only by the gateway). Errs towards yes: a false yes costs a protocol rewrite, a false no
/// costs streaming the rows through the gateway.
pub fn may_return_rows(text: &str) -> bool {
    let mut buf = [0u8; 16];
    let first = first_word_upper(text, &mut buf);
    !matches!(
        first,
        "" | "INSERT"
            | "UPDATE"
            | "DELETE"
            | "MERGE"
            | "CREATE"
            | "ALTER"
            | "DROP"
            | "BEGIN"
            | "START"
            | "COMMIT"
            | "END"
            | "ROLLBACK"
            | "ABORT"
            | "SAVEPOINT"
            | "RELEASE"
            | "SET"
            | "RESET"
            | "GRANT"
            | "REVOKE"
            | "TRUNCATE"
            | "VACUUM"
            | "ANALYZE"
            | "ANALYSE"
            | "LISTEN"
            | "UNLISTEN"
            | "NOTIFY"
            | "DISCARD"
            | "DEALLOCATE"
            | "PREPARE"
            | "COMMENT"
            | "DO"
            | "CHECKPOINT"
            | "LOCK"
            | "CLUSTER"
            | "REINDEX"
            | "COPY"
            | "DECLARE"
            | "CLOSE"
            | "MOVE"
            | "LOAD"
            | "SECURITY"
            | "REFRESH"
            | "REASSIGN"
    ) || returning(text)
}

/// Whether a DML statement has a RETURNING clause (lexically).
pub fn returning(text: &str) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        first_word_upper(text, &mut buf),
        "INSERT" | "UPDATE" | "DELETE" | "MERGE"
    ) && contains_upper(text, b"RETURNING")
}

/// A byte that can continue an identifier or a dollar-quote tag (letters, digits, `_`, and
/// any byte of a non-ASCII character).
fn ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Split a simple-query string into statements (byte ranges, trimmed, empty ones dropped),
/// honouring quotes, dollar quotes, identifiers and comments. Returns None when the text
/// has a construct whose semicolons do not end statements (`BEGIN ATOMIC` bodies) or is
/// not closed, so the caller treats it as one unsplittable statement.
pub fn split(text: &str) -> Option<Vec<&str>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' => {
                // E'…' only where the E starts a token (`abcE'x'` is identifier `abce`
                // followed by a standard string), as in PostgreSQL's scanner.
                let escapes = i > 0
                    && (b[i - 1] == b'E' || b[i - 1] == b'e')
                    && !(i > 1 && ident_byte(b[i - 2]));
                i += 1;
                loop {
                    match b.get(i) {
                        None => return None,
                        Some(b'\\') if escapes => i += 2,
                        Some(b'\'') if b.get(i + 1) == Some(&b'\'') => i += 2,
                        Some(b'\'') => break,
                        Some(_) => i += 1,
                    }
                }
            }
            b'"' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None => return None,
                        Some(b'"') if b.get(i + 1) == Some(&b'"') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                // A comment ends at a newline: \n or \r, as PostgreSQL's scanner has it.
                while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 1;
                i += 2;
                while depth > 0 {
                    match (b.get(i), b.get(i + 1)) {
                        (None, _) => return None,
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
                        let close = b[body_start..].windows(tag.len()).position(|w| w == tag)?;
                        i = body_start + close + tag.len();
                        continue;
                    }
                }
            }
            b';' => {
                let piece = text[start..i].trim();
                if !piece.is_empty() {
                    out.push(piece);
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let piece = text[start..].trim();
    if !piece.is_empty() {
        out.push(piece);
    }
    let atomic = out.iter().any(|p| {
        let up = p.to_ascii_uppercase();
        up.contains("BEGIN ATOMIC") || up.contains("BEGIN\nATOMIC")
    });
    if atomic {
        return None;
    }
    Some(out)
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
