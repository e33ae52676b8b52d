//! SQL commands that name a statement or portal the client made through the protocol:
//! `DEALLOCATE [PREPARE] name`, `EXECUTE name [(arguments)]`, `FETCH`/`MOVE [direction]
//! [FROM|IN] name`, `CLOSE name`; and `EXECUTE name` inside another command (`EXPLAIN
//! [ANALYZE] EXECUTE`, sqlx's way to learn a statement's nullable columns; `CREATE TABLE …
//! AS EXECUTE`).
//!
//! The backend knows the client's protocol statements and portals by the gateway's own names
//! (see `owned`), so a driver that prepares or binds through the protocol and then frees or
//! moves by SQL (pgx's `Deallocate`, Rails' statement pool, asyncpg's `Cursor.forward`,
//! which sends `MOVE FORWARD n <portal>`) would be told the name does not exist. A Query
//! (or a Parse's text) that is exactly one such command, naming a statement or portal the
//! server confirmed, goes to the backend with the name the server holds spliced in place of
//! the client's (waiting,
//! like a Bind, while that name's Parse or Bind is unanswered); anything else goes as it
//! came (an SQL-made name, `ALL`, a command among others: the server answers for its own
//! names). An `EXECUTE` of a confirmed protocol statement is renamed wherever it stands in a
//! text that starts like one of these commands, `EXPLAIN`, `CREATE` or a comment, when it is
//! a word of the SQL itself (not in a string, quoted name, dollar quote or comment) followed
//! by its name and then `(`, `;`, `WITH` or the end. Nothing is enforced by this reading: at
//! worst the client's own statement or portal is freed, run or moved, as it asked; rows a
//! FETCH returns are counted and capped from the backend's stream like any others.

use std::ops::Range;

use super::names::Lookup;
use super::owned::{Role, Target};
use super::Pipeline;
use crate::journal::classify::ident_byte;
use crate::journal::classify::Kind;

/// Longest name an unquoted or quoted identifier keeps (PostgreSQL's NAMEDATALEN - 1): a
/// longer one is passed on as it came.
const NAME_MAX: usize = 63;

/// Most words a FETCH or MOVE takes before its cursor name (`FORWARD 5 FROM`).
const DIRECTION_WORDS: usize = 3;

/// Most `EXECUTE`s inside other commands one text has read (bounds the work and the copy).
const EXECUTES_MAX: usize = 16;

/// Which [`SqlName`] a command's name makes.
type MakeName = fn(Vec<u8>) -> SqlName;

/// What a Query's one command names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SqlName {
    /// A prepared statement (DEALLOCATE).
    Statement(Vec<u8>),
    /// A portal closed (CLOSE).
    Portal(Vec<u8>),
    /// A portal run (FETCH, MOVE): renamed only when the portal's statement reads (see
    /// [`Pipeline::sql_renamed`]).
    Fetched(Vec<u8>),
}

impl Pipeline {
    /// Whether the name a Query's one command uses waits for the server's answer to its
    /// Parse or Bind (sent in an earlier group).
    pub(super) fn sql_name_waits(&self, sql: &[u8]) -> bool {
        match sql_named(sql) {
            Some((SqlName::Statement(n), _)) => self.prepared.lookup(&n, self.group).is_wait(),
            Some((SqlName::Portal(n) | SqlName::Fetched(n), _)) => {
                self.portals.lookup(&n, self.group).is_wait()
            }
            None if may_name(sql) => executed(sql)
                .iter()
                .any(|(n, _)| self.prepared.lookup(n, self.group).is_wait()),
            None => false,
        }
    }

    /// The text to send instead of `sql` (a Query's, without its NUL) when its one command
    /// names a protocol statement or portal of the client's: the same bytes with the
    /// server's name for it in place of the client's.
    #[inline]
    pub(super) fn sql_renamed(&self, sql: &[u8]) -> Option<Vec<u8>> {
        // Every Query and Parse passes here: most are told apart by their first byte, with
        // no call.
        if !may_name(sql) {
            return None;
        }
        self.sql_renamed_named(sql)
    }

    #[inline(never)]
    fn sql_renamed_named(&self, sql: &[u8]) -> Option<Vec<u8>> {
        let Some((named, at)) = sql_named(sql) else {
            return self.executes_renamed(sql);
        };
        let backend = match named {
            SqlName::Statement(n) => match self.prepared.lookup(&n, self.group) {
                Lookup::Defined(p) => Target(p.backend, Role::Statement),
                _ => return None,
            },
            SqlName::Portal(n) => match self.portals.lookup(&n, self.group) {
                Lookup::Defined(p) => Target(p.backend, Role::Portal),
                _ => return None,
            },
            // A FETCH runs the portal's statement under the FETCH's record and the server's
            // `FETCH n` tag: only a statement judged a read (as for a cursor made by SQL
            // DECLARE, which only a query can be) is reached, so an UPDATE ... RETURNING
            // bound through the protocol cannot run logged and tagged as a fetch.
            SqlName::Fetched(n) => match self.portals.lookup(&n, self.group) {
                Lookup::Defined(p) if p.kind == Kind::Read => Target(p.backend, Role::Portal),
                _ => return None,
            },
        };
        let name = self.backend_names.render(backend);
        let mut out = Vec::with_capacity(sql.len() + name.as_bytes().len());
        out.extend_from_slice(&sql[..at.start]);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&sql[at.end..]);
        Some(out)
    }
}

impl Pipeline {
    /// `sql` with the server's name in place of each `EXECUTE`d protocol statement of the
    /// client's inside another command ([`executed`]); None when it names none.
    fn executes_renamed(&self, sql: &[u8]) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        for (name, at) in executed(sql) {
            let Lookup::Defined(p) = self.prepared.lookup(&name, self.group) else {
                continue;
            };
            let backend = self
                .backend_names
                .render(Target(p.backend, Role::Statement));
            let o = out.get_or_insert_with(|| Vec::with_capacity(sql.len() + 64));
            o.extend_from_slice(&sql[copied..at.start]);
            o.extend_from_slice(backend.as_bytes());
            copied = at.end;
        }
        let mut o = out?;
        o.extend_from_slice(&sql[copied..]);
        Some(o)
    }
}

/// Each `EXECUTE name` in a text, wherever the command stands (`EXPLAIN (VERBOSE) EXECUTE
/// s(NULL)`, `CREATE TABLE t AS EXECUTE s`, after a comment or another statement): the name
/// as the server reads it and where its bytes are, for an `EXECUTE` that is a word of the
/// SQL itself (not inside a string, quoted identifier, dollar quote or comment), followed by
/// space, the name, and then `(`, `;`, `WITH` or the end (so `GRANT EXECUTE ON`, `EXECUTE
/// FUNCTION f()` are not read). Nothing for a text the scan cannot read as the server would:
/// a backslash in a string (two readings), anything left open. At most [`EXECUTES_MAX`].
pub(super) fn executed(sql: &[u8]) -> Vec<(Vec<u8>, Range<usize>)> {
    let b = sql.strip_suffix(&[0]).unwrap_or(sql);
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() && found.len() < EXECUTES_MAX {
        let c = b[i];
        i = match c {
            b'-' if b.get(i + 1) == Some(&b'-') => {
                i + b[i..]
                    .iter()
                    .take_while(|&&c| c != b'\n' && c != b'\r')
                    .count()
            }
            b'/' if b.get(i + 1) == Some(&b'*') => match comment_end(b, i) {
                Some(end) => end,
                None => return Vec::new(),
            },
            b'\'' | b'"' => {
                let mut j = i + 1;
                loop {
                    match b.get(j) {
                        None => return Vec::new(),
                        Some(b'\\') => return Vec::new(),
                        Some(&q) if q == c && b.get(j + 1) == Some(&c) => j += 2,
                        Some(&q) if q == c => break j + 1,
                        Some(_) => j += 1,
                    }
                }
            }
            b'$' => match dollar_end(b, i) {
                Some(end) => end,
                None => return Vec::new(),
            },
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let n = b[i..].iter().take_while(|&&c| is_ident_char(c)).count();
                if b[i..i + n].eq_ignore_ascii_case(b"execute") {
                    if let Some(hit) = execute_at(b, i + n) {
                        found.push(hit);
                    }
                }
                i + n
            }
            _ => i + 1,
        };
    }
    found
}

/// After the word EXECUTE ending at `at`: the statement it names and where, when space, a
/// name, and then `(`, `;`, `WITH` or the end follow.
fn execute_at(b: &[u8], at: usize) -> Option<(Vec<u8>, Range<usize>)> {
    let rest = skip_space(&b[at..]);
    if rest.len() == b.len() - at {
        return None; // no space after the keyword
    }
    let (name, after) = identifier(rest)?;
    let next = skip_space(after);
    let follows =
        next.is_empty() || matches!(next[0], b'(' | b';') || keyword(next, b"with").is_some();
    let from = b.len() - rest.len();
    follows.then(|| (name, from..b.len() - after.len()))
}

/// The end of the (nested) comment opening at `at`, or None when it is not closed.
fn comment_end(b: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = at;
    loop {
        match (b.get(i)?, b.get(i + 1)) {
            (b'/', Some(b'*')) => {
                depth += 1;
                i += 2;
            }
            (b'*', Some(b'/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
    }
}

/// After a `$` at `at`: past a parameter (`$1`) or a dollar-quoted string (`$tag$ … $tag$`);
/// None when the quote is not closed. (A `$` inside a word is read with the word.)
fn dollar_end(b: &[u8], at: usize) -> Option<usize> {
    let digits = b[at + 1..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if digits > 0 {
        return Some(at + 1 + digits);
    }
    let tag_len = b[at + 1..].iter().take_while(|&&c| ident_byte(c)).count();
    if b.get(at + 1 + tag_len) != Some(&b'$') {
        return Some(at + 1); // a lone `$`: the server's error, not a quote
    }
    let tag = &b[at..at + tag_len + 2];
    let body = at + tag.len();
    let close = b[body..].windows(tag.len()).position(|w| w == tag)?;
    Some(body + close + tag.len())
}

/// The statement or portal a text that is only one `DEALLOCATE [PREPARE] name`,
/// `EXECUTE name [(arguments)]`, `FETCH`/`MOVE [direction] [FROM | IN] name` or `CLOSE
/// name` names (an EXECUTE's arguments are not read: the caller splices the name only when
/// the text is one statement), as the server reads
/// it (unquoted: ASCII letters lowered; quoted: `""` is a quote), and where the name's
/// bytes are. None for anything else, `ALL` included. A Query's body may end with its NUL.
pub(super) fn sql_named(sql: &[u8]) -> Option<(SqlName, Range<usize>)> {
    let body = sql.strip_suffix(&[0]).unwrap_or(sql);
    let start = skip_space(body);
    let (rest, named): (&[u8], MakeName) = if let Some(r) = keyword(start, b"deallocate") {
        let after = skip_space(r);
        if after.len() == r.len() {
            return None; // no space after the keyword
        }
        match keyword(after, b"prepare") {
            // `DEALLOCATE prepare` alone names a statement called "prepare".
            Some(r2) if skip_space(r2).len() < r2.len() && !at_end(skip_space(r2)) => {
                (skip_space(r2), SqlName::Statement)
            }
            _ => (after, SqlName::Statement),
        }
    } else if let Some(r) = keyword(start, b"execute") {
        let rest = skip_space(r);
        if rest.len() == r.len() {
            return None;
        }
        let (name, after) = identifier(rest)?;
        if !at_end(after) && skip_space(after).first() != Some(&b'(') {
            return None;
        }
        let from = body.len() - rest.len();
        return Some((SqlName::Statement(name), from..body.len() - after.len()));
    } else if let Some(r) = keyword(start, b"close") {
        (skip_space(r), SqlName::Portal)
    } else if let Some(r) = keyword(start, b"fetch").or_else(|| keyword(start, b"move")) {
        (last_word(r)?, SqlName::Fetched)
    } else {
        return None;
    };
    let (name, after) = identifier(rest)?;
    if !at_end(after) {
        return None;
    }
    let from = body.len() - rest.len();
    let at = from..body.len() - after.len();
    Some((named(name), at))
}

/// After FETCH or MOVE: the cursor name's start, past at most [`DIRECTION_WORDS`] words of
/// direction, count and FROM/IN (plain words or signed numbers: anything else, a comment
/// or a quote among them, is not read). The name is the last word.
fn last_word(s: &[u8]) -> Option<&[u8]> {
    let mut rest = skip_space(s);
    if rest.len() == s.len() {
        return None; // no space after the keyword
    }
    for _ in 0..=DIRECTION_WORDS {
        if rest.first() == Some(&b'"') {
            return Some(rest); // a quoted identifier: only the name can be quoted
        }
        let n = rest
            .iter()
            .enumerate()
            .take_while(|&(i, &b)| is_ident_char(b) || (i == 0 && matches!(b, b'+' | b'-')))
            .count();
        if n == 0 {
            return None;
        }
        let after = skip_space(&rest[n..]);
        if at_end(&rest[n..]) {
            return Some(rest);
        }
        if after.len() == rest.len() - n {
            return None; // a word not followed by a space: not read
        }
        rest = after;
    }
    None
}

/// Whether `sql` may start with one of the commands read here: its first byte is the first
/// letter of one (`EXPLAIN` and `CREATE` among them), space or a comment (read on).
#[inline]
fn may_name(sql: &[u8]) -> bool {
    matches!(
        sql.first().map(u8::to_ascii_lowercase),
        Some(
            b'd' | b'e' | b'c' | b'f' | b'm' | b'/' | b'-' | b' ' | b'\t' | b'\n' | b'\r' | b'\x0c'
        )
    )
}

fn skip_space(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &s[n..]
}

/// The rest after `kw` (lower case) when `s` starts with it as a whole word.
fn keyword<'a>(s: &'a [u8], kw: &[u8]) -> Option<&'a [u8]> {
    let head = s.get(..kw.len())?;
    if !head.eq_ignore_ascii_case(kw) {
        return None;
    }
    let rest = &s[kw.len()..];
    match rest.first() {
        Some(&b) if is_ident_char(b) => None,
        _ => Some(rest),
    }
}

/// A byte that continues an unquoted identifier (`$` too, unlike a dollar-quote tag).
fn is_ident_char(b: u8) -> bool {
    ident_byte(b) || b == b'$'
}

/// Only whitespace and at most one `;` are left.
fn at_end(s: &[u8]) -> bool {
    let s = skip_space(s);
    let s = s.strip_prefix(b";").unwrap_or(s);
    skip_space(s).is_empty()
}

/// An identifier at the start of `s`, as the server reads it, and what follows it.
fn identifier(s: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let (name, rest) = match s.first()? {
        b'"' => {
            let mut name = Vec::new();
            let mut i = 1;
            loop {
                match s.get(i)? {
                    b'"' if s.get(i + 1) == Some(&b'"') => {
                        name.push(b'"');
                        i += 2;
                    }
                    b'"' => break,
                    &b => {
                        name.push(b);
                        i += 1;
                    }
                }
                if name.len() > NAME_MAX {
                    return None; // longer than any name the server keeps: not copied on
                }
            }
            if name.is_empty() {
                return None; // a zero-length identifier is an error of the server's
            }
            (name, &s[i + 1..])
        }
        &b if b.is_ascii_alphabetic() || b == b'_' || b >= 0x80 => {
            let n = s.iter().take_while(|&&b| is_ident_char(b)).count();
            let word = &s[..n];
            if word.eq_ignore_ascii_case(b"all") {
                return None;
            }
            (word.to_ascii_lowercase(), &s[n..])
        }
        _ => return None,
    };
    (name.len() <= NAME_MAX).then_some((name, rest))
}

#[cfg(test)]
mod tests {
    use super::{executed, sql_named, SqlName};

    #[test]
    fn an_execute_inside_another_command_is_read_only_where_the_sql_itself_says_it() {
        // (the text, each name the server would execute with its bytes in the text)
        let table: &[(&str, &[(&str, &str)])] = &[
            (
                "EXPLAIN (VERBOSE, FORMAT JSON) EXECUTE sqlx_s_1(NULL)",
                &[("sqlx_s_1", "sqlx_s_1")],
            ),
            ("explain analyze execute S1", &[("s1", "S1")]),
            (
                "create temp table t as execute s1 with no data",
                &[("s1", "s1")],
            ),
            ("/* c */ execute \"S\"\"1\"(1);", &[("S\"1", "\"S\"\"1\"")]),
            ("-- c\nexecute a; execute b (2)", &[("a", "a"), ("b", "b")]),
            ("select 'execute a'", &[]),
            ("select \"execute a\"", &[]),
            ("select $$execute a$$, $t$ execute b $t$", &[]),
            ("select 1 /* execute a */", &[]),
            ("select 1 -- execute a", &[]),
            ("grant execute on function f() to r", &[]),
            (
                "create trigger t after insert on x execute function f()",
                &[],
            ),
            ("execute all", &[]),
            ("execute a b", &[]),
            ("executea(1)", &[]),
            ("x.execute a", &[("a", "a")]),
            ("select $1, execute_a(1)", &[]),
            // Read as the server might not: nothing is renamed.
            ("select E'\\'' ; execute a", &[]),
            ("select 'open; execute a", &[]),
            ("/* open execute a", &[]),
            ("select $q$ open execute a", &[]),
        ];
        for (sql, want) in table {
            let got: Vec<(Vec<u8>, String)> = executed(sql.as_bytes())
                .into_iter()
                .map(|(n, at)| (n, sql[at].to_string()))
                .collect();
            let want: Vec<(Vec<u8>, String)> = want
                .iter()
                .map(|(n, at)| (n.as_bytes().to_vec(), at.to_string()))
                .collect();
            assert_eq!(got, want, "{sql}");
        }
        // Bounded: a text of many EXECUTEs is read up to the limit.
        let many = "execute a;".repeat(100);
        assert_eq!(executed(many.as_bytes()).len(), super::EXECUTES_MAX);
    }

    #[test]
    fn a_lone_fetch_move_or_close_names_its_portal_by_its_last_word() {
        // (the query text, the portal the server would use, the name's bytes in the text)
        let table: &[(&str, Option<(&str, &str)>)] = &[
            (
                "MOVE FORWARD 5 __asyncpg_portal_3__",
                Some(("__asyncpg_portal_3__", "__asyncpg_portal_3__")),
            ),
            ("fetch c", Some(("c", "c"))),
            ("FETCH NEXT FROM C1;", Some(("c1", "C1"))),
            (
                "fetch forward all in \"My\"\"C\"",
                Some(("My\"C", "\"My\"\"C\"")),
            ),
            ("fetch -5 from c", Some(("c", "c"))),
            ("fetch absolute +3 from c", Some(("c", "c"))),
            ("fetch backward 2 in c ;  ", Some(("c", "c"))),
            ("move c", Some(("c", "c"))),
            ("close c", Some(("c", "c"))),
            ("CLOSE \"C\";", Some(("C", "\"C\""))),
            ("close all", None),
            ("fetch all", None),
            ("fetch 5", None),
            ("fetch forward 5 from a b", None),
            ("fetch a b c d e", None),
            ("fetch /* x */ c", None),
            ("fetch -- x\n c", None),
            ("fetch \"a\" from c", None),
            ("fetch c; select 1", None),
            ("fetch c;;", None),
            ("fetchc", None),
            ("fetch", None),
            ("select 1 from c", None),
            ("close \"\"", None),
        ];
        for (sql, want) in table {
            let got = match sql_named(sql.as_bytes()) {
                Some((SqlName::Portal(n) | SqlName::Fetched(n), at)) => {
                    Some((n, sql[at].to_string()))
                }
                Some((SqlName::Statement(_), _)) => panic!("{sql}: not a statement"),
                None => None,
            };
            let want = want.map(|(n, at)| (n.as_bytes().to_vec(), at.to_string()));
            assert_eq!(got, want, "{sql}");
        }
        // The NUL a Query's body ends with is not part of the command.
        let (_, at) = sql_named(b"close c\0").expect("read");
        assert_eq!(at, 6..7);
    }

    #[test]
    fn only_a_lone_deallocate_of_one_name_is_read() {
        let long = format!("deallocate {}", "a".repeat(64));
        let long_quoted = format!("deallocate \"{}\"", "a".repeat(1 << 20));
        let longest = "b".repeat(63);
        let longest_quoted = format!("deallocate \"{longest}\"");
        // (the query text, the name the server would free)
        let table: &[(&str, Option<&str>)] = &[
            ("deallocate test", Some("test")),
            ("EXECUTE foobar", Some("foobar")),
            ("execute s1 (1, 'a;b')", Some("s1")),
            ("execute \"S1\"(1)", Some("S1")),
            ("execute s1 2", None),
            ("execute", None),
            ("executes1", None),
            ("DEALLOCATE \"test\"", Some("test")),
            ("  Deallocate Prepare S1 ;  ", Some("s1")),
            ("deallocate \"Mixed\"\"Q\"", Some("Mixed\"Q")),
            ("deallocate prepare", Some("prepare")),
            ("deallocate lrupsc_1_0;", Some("lrupsc_1_0")),
            ("deallocate all", None),
            ("deallocate prepare all", None),
            ("deallocate \"all\"", Some("all")),
            ("deallocate a; select 1", None),
            ("deallocate a b", None),
            ("deallocate", None),
            ("deallocatea", None),
            ("deallocate \"\"", None),
            ("deallocate \"open", None),
            ("/* c */ deallocate a", None),
            ("select 'deallocate a'", None),
            ("deallocate a;;", None),
            (&long, None),
            (&long_quoted, None),
            (&longest_quoted, Some(&longest)),
        ];
        for (sql, want) in table {
            let got = match sql_named(sql.as_bytes()) {
                Some((SqlName::Statement(n), at)) => {
                    assert_eq!(
                        sql.as_bytes()[at].eq_ignore_ascii_case(&n),
                        !sql.contains('"')
                    );
                    Some(n)
                }
                _ => None,
            };
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{sql}");
        }
    }
}
