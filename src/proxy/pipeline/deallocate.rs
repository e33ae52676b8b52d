//! SQL `DEALLOCATE` of a statement the client prepared through the protocol.
//!
//! The backend knows the client's protocol statements by the gateway's own names (see
//! `owned`), so a driver that prepares with Parse and frees with SQL (pgx's `Deallocate`,
//! Rails' statement pool) would be told the statement does not exist. A Query that is
//! exactly `DEALLOCATE [PREPARE] name`, naming a statement the server confirmed, goes to the
//! backend with the name the server holds (waiting, like a Bind, while that name's Parse is
//! unanswered); anything else goes as it came (an SQL `PREPARE`d
//! name, `ALL`, a statement among others: the server answers for its own names). Nothing is
//! enforced by this reading: at worst the client's own statement is freed, as it asked.

use bytes::Bytes;

use super::names::Lookup;
use super::outbox::put_message;
use super::owned::{Role, Target};
use super::Pipeline;
use crate::journal::classify::ident_byte;

/// Longest name an unquoted or quoted identifier keeps (PostgreSQL's NAMEDATALEN - 1): a
/// longer one is passed on as it came.
const NAME_MAX: usize = 63;

impl Pipeline {
    /// The Query to send instead of `sql` when it frees a protocol statement of the client's.
    pub(super) fn sql_deallocate(&self, sql: &[u8]) -> Option<Bytes> {
        let name = deallocated_name(sql)?;
        let Lookup::Defined(p) = self.prepared.lookup(&name, self.group) else {
            return None;
        };
        let backend = self
            .backend_names
            .render(Target(p.backend, Role::Statement));
        let mut out = Vec::with_capacity(48);
        put_message(&mut out, b'Q', &[b"DEALLOCATE ", backend.as_bytes(), b"\0"]);
        Some(Bytes::from(out))
    }
}

/// The statement name of a text that is only `DEALLOCATE [PREPARE] name [;]`, as the server
/// reads it (unquoted: ASCII letters lowered; quoted: `""` is a quote). None for anything
/// else, `ALL` included. A Query's body may end with its NUL.
pub(super) fn deallocated_name(sql: &[u8]) -> Option<Vec<u8>> {
    let sql = sql.strip_suffix(&[0]).unwrap_or(sql);
    let mut rest = skip_space(sql);
    rest = keyword(rest, b"deallocate")?;
    let after_kw = skip_space(rest);
    if after_kw.len() == rest.len() {
        return None; // no space after the keyword
    }
    rest = after_kw;
    if let Some(r) = keyword(rest, b"prepare") {
        let r2 = skip_space(r);
        // `DEALLOCATE prepare` alone names a statement called "prepare".
        if r2.len() < r.len() && !at_end(r2) {
            rest = r2;
        }
    }
    let (name, r) = identifier(rest)?;
    at_end(r).then_some(name)
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
    use super::deallocated_name;

    #[test]
    fn only_a_lone_deallocate_of_one_name_is_read() {
        let long = format!("deallocate {}", "a".repeat(64));
        let long_quoted = format!("deallocate \"{}\"", "a".repeat(1 << 20));
        let longest = "b".repeat(63);
        let longest_quoted = format!("deallocate \"{longest}\"");
        // (the query text, the name the server would free)
        let table: &[(&str, Option<&str>)] = &[
            ("deallocate test", Some("test")),
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
            let got = deallocated_name(sql.as_bytes());
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{sql}");
        }
    }
}
