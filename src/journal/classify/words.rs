//! The classifier's look at a statement's leading words: the keyword fallback for what
//! the parser does not understand, and the cheap lexical guesses the relay makes per
//! statement (may it return rows, does it name catalogs, RETURNING). A wrong guess costs
//! only an early stop or a label: caps and the log count from the backend's stream.

use super::Kind;

/// The first `n` words of a statement, upper-cased, skipping comments and parentheses.
pub(super) fn leading_words(text: &str, n: usize) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = text.char_indices().peekable();
    let bytes = text.as_bytes();
    while let Some((i, c)) = chars.next() {
        if words.len() >= n {
            break;
        }
        if c == '-' && bytes.get(i + 1) == Some(&b'-') {
            // A line comment ends at \n or \r, as in PostgreSQL's scanner.
            for (_, c) in chars.by_ref() {
                if c == '\n' || c == '\r' {
                    break;
                }
            }
        } else if c == '/' && bytes.get(i + 1) == Some(&b'*') {
            // Block comments nest: the opener just seen is depth 1.
            chars.next();
            let mut depth = 1usize;
            while depth > 0 {
                match chars.next() {
                    None => break,
                    Some((j, '/')) if bytes.get(j + 1) == Some(&b'*') => {
                        chars.next();
                        depth += 1;
                    }
                    Some((j, '*')) if bytes.get(j + 1) == Some(&b'/') => {
                        chars.next();
                        depth -= 1;
                    }
                    Some(_) => {}
                }
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
pub(super) fn first_word_is(text: &str, word: &str) -> bool {
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
#[cfg(test)]
pub(super) fn first_word_upper<'b>(text: &str, buf: &'b mut [u8; 16]) -> &'b str {
    std::str::from_utf8(first_word_upper_bytes(text, buf)).unwrap_or("?")
}

/// [`first_word_upper`] as bytes: compared with keywords byte-wise, so the hot path pays
/// no UTF-8 check of a word it only compares (a whole word of `leading_words` is UTF-8).
fn first_word_upper_bytes<'b>(text: &str, buf: &'b mut [u8; 16]) -> &'b [u8] {
    let slow;
    let w: &str = match first_word_fast(text) {
        FirstWord::Word(w) => w,
        FirstWord::None => return b"",
        FirstWord::Slow => {
            slow = leading_words(text, 1);
            match slow.first() {
                Some(w) => w.as_str(),
                None => return b"",
            }
        }
    };
    let Some(dst) = buf.get_mut(..w.len()) else {
        return b"?";
    };
    dst.copy_from_slice(w.as_bytes());
    dst.make_ascii_uppercase();
    dst
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
        // Only the parser tells a data-modifying WITH (or EXPLAIN ANALYZE) from a read.
        "WITH" | "EXPLAIN" => Kind::Unparsed,
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
        | "UNLISTEN" | "NOTIFY" | "DISCARD" | "DEALLOCATE" | "LOAD" | "LOCK" | "CALL" => {
            Kind::Utility
        }
        _ => Kind::Unparsed,
    }
}

/// Whether a statement may read system catalogs (it names `pg_…` or
/// `information_schema`): the backend is then not stopped at the row cap, so that a
/// driver's own catalog query can be recognised from its RowDescription and passed whole.
/// A wrong guess only costs the early stop: rows are still capped from the stream.
pub fn may_read_catalogs(text: &str) -> bool {
    // Looked for at each `_` only (found a word at a time): this runs for every statement
    // on the hot path.
    let b = text.as_bytes();
    let mut i = 0;
    loop {
        i = super::skip_words(b, i, |x| super::has_byte(x, b'_'));
        let Some(&c) = b.get(i) else { return false };
        let found = c == b'_'
            && ((i >= 2 && b[i - 2..i].eq_ignore_ascii_case(b"pg"))
                || (i >= 11
                    && b[i - 11..i].eq_ignore_ascii_case(b"information")
                    && b.get(i + 1..i + 7)
                        .is_some_and(|w| w.eq_ignore_ascii_case(b"schema"))));
        if found {
            return true;
        }
        i += 1;
    }
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
    rows_by_first_word(first_word_upper_bytes(text, &mut buf), text)
}

/// [`may_return_rows`] and whether the first word is COPY, from one look at the first word
/// (the relay asks both of each statement of a simple Query).
pub fn rows_and_copy(text: &str) -> (bool, bool) {
    let mut buf = [0u8; 16];
    let first = first_word_upper_bytes(text, &mut buf);
    (rows_by_first_word(first, text), first == b"COPY")
}

/// [`may_return_rows`] given the upper-cased first word.
fn rows_by_first_word(first: &[u8], text: &str) -> bool {
    !matches!(
        first,
        b"" | b"INSERT"
            | b"UPDATE"
            | b"DELETE"
            | b"MERGE"
            | b"CREATE"
            | b"ALTER"
            | b"DROP"
            | b"BEGIN"
            | b"START"
            | b"COMMIT"
            | b"END"
            | b"ROLLBACK"
            | b"ABORT"
            | b"SAVEPOINT"
            | b"RELEASE"
            | b"SET"
            | b"RESET"
            | b"GRANT"
            | b"REVOKE"
            | b"TRUNCATE"
            | b"VACUUM"
            | b"ANALYZE"
            | b"ANALYSE"
            | b"LISTEN"
            | b"UNLISTEN"
            | b"NOTIFY"
            | b"DISCARD"
            | b"DEALLOCATE"
            | b"PREPARE"
            | b"COMMENT"
            | b"DO"
            | b"CHECKPOINT"
            | b"LOCK"
            | b"CLUSTER"
            | b"REINDEX"
            | b"COPY"
            | b"DECLARE"
            | b"CLOSE"
            | b"MOVE"
            | b"LOAD"
            | b"SECURITY"
            | b"REFRESH"
            | b"REASSIGN"
    ) || returning_after(first, text)
}

/// Whether a DML statement has a RETURNING clause (lexically).
pub fn returning(text: &str) -> bool {
    let mut buf = [0u8; 16];
    returning_after(first_word_upper_bytes(text, &mut buf), text)
}

/// [`returning`] given the upper-cased first word.
fn returning_after(first: &[u8], text: &str) -> bool {
    matches!(first, b"INSERT" | b"UPDATE" | b"DELETE" | b"MERGE")
        && contains_upper(text, b"RETURNING")
}
