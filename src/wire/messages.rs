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

/// ParameterStatus.
pub fn parameter_status(key: &str, value: &str) -> Bytes {
    let mut b = BytesMut::new();
    put_cstr(&mut b, key.as_bytes());
    put_cstr(&mut b, value.as_bytes());
    build(b'S', &b)
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

fn put_cstr(b: &mut BytesMut, s: &[u8]) {
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

/// Rebuild an ErrorResponse/NoticeResponse without the server's source location fields
/// (F, L, R) and with every `secret` replaced in the text fields. Returns None when the
/// frame needs no change, so it is relayed as it came.
pub fn scrub_error(tag: u8, body: &[u8], secrets: &[String]) -> Option<Bytes> {
    let fields = error_fields(body)?;
    let mut changed = false;
    let mut b = BytesMut::with_capacity(body.len());
    for (t, v) in fields {
        if matches!(t, b'F' | b'L' | b'R') {
            changed = true;
            continue;
        }
        b.put_u8(t);
        let mut v = v.to_vec();
        for s in secrets {
            if !s.is_empty() && contains(&v, s.as_bytes()) {
                v = replace(&v, s.as_bytes(), b"[redacted]");
                changed = true;
            }
        }
        put_cstr(&mut b, &v);
    }
    b.put_u8(0);
    changed.then(|| build(tag, &b))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn replace(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
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
    fn scrub_removes_location_and_secrets() {
        let e = error_response(
            Severity::Error,
            "42P01",
            "no such file /tmp/s/.s.PGSQL.5432 for sandpit_admin",
        );
        let mut body = e[5..e.len() - 1].to_vec();
        body.extend_from_slice(b"Fpostinit.c\0L123\0Rfoo\0\0");
        let out = scrub_error(b'E', &body, &["/tmp/s".into(), "sandpit_admin".into()]).unwrap();
        let s = String::from_utf8_lossy(&out);
        assert!(!s.contains("/tmp/s") && !s.contains("sandpit_admin") && !s.contains("postinit"));
        assert!(s.contains("42P01") && s.contains("[redacted]"));
        assert_eq!(error_code(&out[5..]).as_deref(), Some("42P01"));
        // Unchanged errors are not rebuilt.
        let plain = error_response(Severity::Error, "42P01", "relation x does not exist");
        assert!(scrub_error(b'E', &plain[5..], &["/tmp/s".into()]).is_none());
    }

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
