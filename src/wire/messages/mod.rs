//! Builders for the backend messages the gateway itself sends, and typed views over raw
//! frames it has to look into. Views borrow the raw bytes; nothing is re-encoded unless changed.

use bytes::{BufMut, Bytes, BytesMut};

use super::frame::build;

/// AuthenticationOk.
pub fn auth_ok() -> Bytes {
    build(b'R', &0i32.to_be_bytes())
}

/// AuthenticationCleartextPassword.
pub fn auth_cleartext() -> Bytes {
    build(b'R', &3i32.to_be_bytes())
}

/// AuthenticationSASL offering the given mechanisms.
pub fn auth_sasl(mechanisms: &[&str]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i32(10);
    for m in mechanisms {
        b.put_slice(m.as_bytes());
        b.put_u8(0);
    }
    b.put_u8(0);
    build(b'R', &b)
}

/// AuthenticationSASLContinue.
pub fn auth_sasl_continue(data: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i32(11);
    b.put_slice(data);
    build(b'R', &b)
}

/// AuthenticationSASLFinal.
pub fn auth_sasl_final(data: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i32(12);
    b.put_slice(data);
    build(b'R', &b)
}

/// BackendKeyData.
pub fn backend_key_data(pid: i32, secret: i32) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i32(pid);
    b.put_i32(secret);
    build(b'K', &b)
}

/// ReadyForQuery with a transaction status byte (b'I', b'T', b'E').
pub fn ready_for_query(status: u8) -> Bytes {
    build(b'Z', &[status])
}

/// NegotiateProtocolVersion: newest minor version we support and the options we did not recognise.
pub fn negotiate_protocol_version(minor: i32, unrecognized: &[&str]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i32(minor);
    b.put_i32(unrecognized.len() as i32);
    for o in unrecognized {
        put_cstr(&mut b, o.as_bytes());
    }
    build(b'v', &b)
}

/// Severity of an error the gateway raises itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Ends the statement.
    Error,
    /// Ends the session.
    Fatal,
}

/// ErrorResponse with severity, SQLSTATE and message.
pub fn error_response(severity: Severity, code: &str, message: &str) -> Bytes {
    let sev = match severity {
        Severity::Error => "ERROR",
        Severity::Fatal => "FATAL",
    };
    let mut b = BytesMut::new();
    for (t, v) in [(b'S', sev), (b'V', sev), (b'C', code), (b'M', message)] {
        b.put_u8(t);
        put_cstr(&mut b, v.as_bytes());
    }
    b.put_u8(0);
    build(b'E', &b)
}

/// NoticeResponse (severity NOTICE or WARNING) with SQLSTATE and message.
pub fn notice_response(severity: &str, code: &str, message: &str) -> Bytes {
    let mut b = BytesMut::new();
    for (t, v) in [
        (b'S', severity),
        (b'V', severity),
        (b'C', code),
        (b'M', message),
    ] {
        b.put_u8(t);
        put_cstr(&mut b, v.as_bytes());
    }
    b.put_u8(0);
    build(b'N', &b)
}

pub(super) fn put_cstr(b: &mut BytesMut, s: &[u8]) {
    b.put_slice(s);
    b.put_u8(0);
}

fn cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = b.iter().position(|&c| c == 0)?;
    Some((&b[..end], &b[end + 1..]))
}

/// Fields of an ErrorResponse / NoticeResponse body, in order.
pub fn error_fields(body: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let (&t, after) = rest.split_first()?;
        if t == 0 {
            return Some(out);
        }
        let (v, after) = cstr(after)?;
        out.push((t, v));
        rest = after;
    }
}

/// The SQLSTATE of an ErrorResponse body.
pub fn error_code(body: &[u8]) -> Option<String> {
    error_fields(body)?
        .into_iter()
        .find(|(t, _)| *t == b'C')
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// Whether a RowDescription body describes columns that all come from system catalogs
/// (table OID below 16384, PostgreSQL's FirstNormalObjectId); computed columns (OID 0) or
/// any user table make it false.
pub fn reads_only_catalogs(body: &[u8]) -> bool {
    let Some(n) = body.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
        return false;
    };
    if n <= 0 {
        return false;
    }
    let mut rest = &body[2..];
    for _ in 0..n {
        let Some((_, after)) = cstr(rest) else {
            return false;
        };
        let Some(oid) = after
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return false;
        };
        if oid == 0 || oid >= 16384 {
            return false;
        }
        // table oid 4, attnum 2, type oid 4, typlen 2, typmod 4, format 2
        let Some(next) = after.get(18..) else {
            return false;
        };
        rest = next;
    }
    true
}

/// Whether an ErrorResponse body ends the session (severity FATAL or PANIC).
pub fn is_fatal(body: &[u8]) -> bool {
    error_fields(body).is_some_and(|f| {
        f.iter()
            .any(|(t, v)| matches!(t, b'V' | b'S') && matches!(*v, b"FATAL" | b"PANIC"))
    })
}

/// A SASLInitialResponse: mechanism and initial client data.
pub fn sasl_initial_response(body: &[u8]) -> Option<(&str, &[u8])> {
    let (mech, rest) = cstr(body)?;
    let mech = std::str::from_utf8(mech).ok()?;
    if rest.len() < 4 {
        return None;
    }
    let len = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let data = &rest[4..];
    if len < 0 || len as usize != data.len() {
        return None;
    }
    Some((mech, data))
}

/// A PasswordMessage carrying a cleartext password.
pub fn password_message(body: &[u8]) -> Option<&[u8]> {
    let (pw, rest) = cstr(body)?;
    rest.is_empty().then_some(pw)
}

/// BackendKeyData: (pid, secret).
pub fn backend_key(body: &[u8]) -> Option<(i32, i32)> {
    if body.len() != 8 {
        return None;
    }
    Some((
        i32::from_be_bytes([body[0], body[1], body[2], body[3]]),
        i32::from_be_bytes([body[4], body[5], body[6], body[7]]),
    ))
}

/// The authentication request code of an 'R' message.
pub fn auth_code(body: &[u8]) -> Option<i32> {
    (body.len() >= 4).then(|| i32::from_be_bytes([body[0], body[1], body[2], body[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_refuse_garbage() {
        assert!(sasl_initial_response(b"SCRAM").is_none());
        assert!(sasl_initial_response(b"SCRAM\0\0\0\0\x09abc").is_none());
        assert_eq!(
            sasl_initial_response(b"M\0\0\0\0\x03abc"),
            Some(("M", &b"abc"[..]))
        );
        assert!(password_message(b"abc").is_none());
        assert!(backend_key(b"123").is_none());
        assert!(error_fields(b"Mabc").is_none());
    }
}

/// Frontend message views and builders used by the relay (extended protocol).
pub mod frontend {
    use bytes::{BufMut, Bytes, BytesMut};

    use super::{cstr, put_cstr};
    use crate::wire::frame::build;

    /// A Parse message: statement name and query text (raw bytes).
    pub fn parse(body: &[u8]) -> Option<(&[u8], &[u8])> {
        let (name, rest) = cstr(body)?;
        let (query, _) = cstr(rest)?;
        Some((name, query))
    }

    /// A Bind message's parts the gateway needs.
    pub struct Bind<'a> {
        /// Portal name.
        pub portal: &'a [u8],
        /// Statement name.
        pub statement: &'a [u8],
        /// Parameter values with their format (0 text, 1 binary); None is NULL.
        pub params: Values<'a>,
    }

    fn i16_at(b: &[u8], at: usize) -> Option<i16> {
        Some(i16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
    }

    /// A count of the protocol's Int16 counts: unsigned, as the server reads them (a Bind
    /// may carry up to 65,535 parameters).
    fn count_at(b: &[u8], at: usize) -> Option<usize> {
        Some(usize::from(u16::from_be_bytes([
            *b.get(at)?,
            *b.get(at + 1)?,
        ])))
    }

    fn i32_at(b: &[u8], at: usize) -> Option<i32> {
        Some(i32::from_be_bytes([
            *b.get(at)?,
            *b.get(at + 1)?,
            *b.get(at + 2)?,
            *b.get(at + 3)?,
        ]))
    }

    /// A Bind's portal and statement names, read even when its values cannot be.
    pub fn bind_names(body: &[u8]) -> Option<(&[u8], &[u8])> {
        let (portal, rest) = cstr(body)?;
        let (statement, _) = cstr(rest)?;
        Some((portal, statement))
    }

    /// Parse a Bind body. Every count and length is checked against the body it came in.
    pub fn bind(body: &[u8]) -> Option<Bind<'_>> {
        let (portal, rest) = cstr(body)?;
        let (statement, rest) = cstr(rest)?;
        let params = values_with_formats(rest)?;
        Some(Bind {
            portal,
            statement,
            params,
        })
    }

    /// A FunctionCall body: the function's OID and its arguments with their formats (0 text,
    /// 1 binary; None is NULL). Every count and length is checked against the body.
    pub fn function_call(body: &[u8]) -> Option<(u32, Values<'_>)> {
        let oid = u32::from_be_bytes([*body.first()?, *body.get(1)?, *body.get(2)?, *body.get(3)?]);
        Some((oid, values_with_formats(&body[4..])?))
    }

    /// The format codes, then the values, of a Bind or FunctionCall: each value with the
    /// format that applies to it (none given: text; one: all; else one each).
    fn values_with_formats(rest: &[u8]) -> Option<Values<'_>> {
        let nfmt = count_at(rest, 0)?;
        let formats = rest.get(2..2 + 2 * nfmt)?;
        let at = 2 + formats.len();
        let n = count_at(rest, at)?;
        if formats.len() > 2 && formats.len() < 2 * n {
            return None; // several formats but not one per value
        }
        // Every length checked now, so reading them later cannot fail.
        let values = &rest[at + 2..];
        let mut pos = 0usize;
        for _ in 0..n {
            let len = i32_at(values, pos)?;
            pos += 4;
            if len >= 0 {
                pos = pos.checked_add(len as usize)?;
                if pos > values.len() {
                    return None;
                }
            }
        }
        Some(Values {
            formats,
            values: &values[..pos],
            n,
        })
    }

    /// The values of a Bind or FunctionCall with the format that applies to each (none
    /// given: text; one: all; else one each), checked when parsed and read in place (no
    /// allocation per message).
    #[derive(Clone, Copy, Debug)]
    pub struct Values<'a> {
        /// The format codes, two bytes each.
        formats: &'a [u8],
        /// The length-prefixed values, exactly `n` of them.
        values: &'a [u8],
        n: usize,
    }

    impl<'a> Values<'a> {
        /// How many values.
        pub fn len(&self) -> usize {
            self.n
        }

        /// No values.
        pub fn is_empty(&self) -> bool {
            self.n == 0
        }

        /// Each value (None is NULL) with its format (0 text, 1 binary).
        pub fn iter(&self) -> ValuesIter<'a> {
            ValuesIter {
                formats: self.formats,
                rest: self.values,
                i: 0,
                n: self.n,
            }
        }
    }

    impl<'a> IntoIterator for &Values<'a> {
        type Item = (i16, Option<&'a [u8]>);
        type IntoIter = ValuesIter<'a>;
        fn into_iter(self) -> ValuesIter<'a> {
            self.iter()
        }
    }

    /// An iterator over [`Values`].
    pub struct ValuesIter<'a> {
        formats: &'a [u8],
        rest: &'a [u8],
        i: usize,
        n: usize,
    }

    impl<'a> Iterator for ValuesIter<'a> {
        type Item = (i16, Option<&'a [u8]>);

        fn next(&mut self) -> Option<Self::Item> {
            if self.i >= self.n {
                return None;
            }
            let fmt = match self.formats.len() / 2 {
                0 => 0,
                1 => i16_at(self.formats, 0)?,
                _ => i16_at(self.formats, 2 * self.i)?,
            };
            let len = i32_at(self.rest, 0)?;
            self.i += 1;
            if len < 0 {
                self.rest = self.rest.get(4..)?;
                return Some((fmt, None));
            }
            let end = 4 + len as usize;
            let v = self.rest.get(4..end)?;
            self.rest = self.rest.get(end..)?;
            Some((fmt, Some(v)))
        }

        fn size_hint(&self) -> (usize, Option<usize>) {
            let left = self.n - self.i;
            (left, Some(left))
        }
    }

    /// An Execute message: portal and max rows (0 = all).
    pub fn execute(body: &[u8]) -> Option<(&[u8], i32)> {
        let (portal, rest) = cstr(body)?;
        Some((portal, i32_at(rest, 0)?))
    }

    /// A Close or Describe message: kind (b'S' or b'P') and name.
    pub fn target(body: &[u8]) -> Option<(u8, &[u8])> {
        let (&kind, rest) = body.split_first()?;
        let (name, _) = cstr(rest)?;
        matches!(kind, b'S' | b'P').then_some((kind, name))
    }

    /// Build Parse (no parameter types).
    pub fn build_parse(name: &[u8], query: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(query.len() + name.len() + 4);
        put_cstr(&mut b, name);
        put_cstr(&mut b, query);
        b.put_i16(0);
        build(b'P', &b)
    }

    /// Build Bind of `statement` into `portal` with no parameters and text results.
    pub fn build_bind(portal: &[u8], statement: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        put_cstr(&mut b, portal);
        put_cstr(&mut b, statement);
        b.put_i16(0);
        b.put_i16(0);
        b.put_i16(0);
        build(b'B', &b)
    }

    /// Build Describe or Close.
    pub fn build_target(tag: u8, kind: u8, name: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(kind);
        put_cstr(&mut b, name);
        build(tag, &b)
    }

    /// Build Execute.
    pub fn build_execute(portal: &[u8], max_rows: i32) -> Bytes {
        let mut b = BytesMut::new();
        put_cstr(&mut b, portal);
        b.put_i32(max_rows);
        build(b'E', &b)
    }

    /// Sync.
    pub fn build_sync() -> Bytes {
        build(b'S', &[])
    }
}

/// CommandComplete with a tag.
pub fn command_complete(tag: &str) -> Bytes {
    let mut b = BytesMut::new();
    put_cstr(&mut b, tag.as_bytes());
    build(b'C', &b)
}

/// [`command_complete`] appended to `out` (the relay's per-statement tag: no message
/// built apart, no allocation).
pub fn put_command_complete(out: &mut BytesMut, tag: &str) {
    out.reserve(tag.len() + 6);
    out.put_u8(b'C');
    out.put_i32(tag.len() as i32 + 5);
    put_cstr(out, tag.as_bytes());
}

/// FunctionCallResponse with a NULL result.
pub fn function_result_null() -> Bytes {
    build(b'V', &(-1i32).to_be_bytes())
}

/// CopyDone.
pub fn copy_done() -> Bytes {
    build(b'c', &[])
}

/// The tag of a CommandComplete body.
pub fn command_tag(body: &[u8]) -> Option<&str> {
    let (tag, _) = cstr(body)?;
    std::str::from_utf8(tag).ok()
}

/// Rows in a command tag ("SELECT 5" → 5, "INSERT 0 3" → 3), when it has a count.
pub fn tag_rows(tag: &str) -> Option<u64> {
    // The last word found byte-wise (`rsplit` with a char pattern costs a reverse UTF-8
    // searcher per result).
    let last = match tag.as_bytes().iter().rposition(|&b| b == b' ') {
        Some(i) => &tag[i + 1..],
        None => tag,
    };
    last.parse().ok()
}

#[cfg(test)]
mod frontend_tests;

#[cfg(test)]
mod tag_tests {
    #[test]
    fn tag_rows_is_the_last_word_as_a_count() {
        for (tag, rows) in [
            ("SELECT 5", Some(5)),
            ("INSERT 0 3", Some(3)),
            ("UPDATE 0", Some(0)),
            ("BEGIN", None),
            ("", None),
            ("SELECT ", None),
            ("SELECT x", None),
            ("7", Some(7)),
            ("COPY 18446744073709551615", Some(u64::MAX)),
            ("COPY 18446744073709551616", None),
            ("MOVE  2", Some(2)),
            ("\u{e9}t\u{e9} 4", Some(4)),
        ] {
            // The reference: the last piece of a split on ' '.
            assert_eq!(
                tag.rsplit(' ').next().and_then(|n| n.parse().ok()),
                rows,
                "{tag:?}"
            );
            assert_eq!(super::tag_rows(tag), rows, "{tag:?}");
        }
    }
}
