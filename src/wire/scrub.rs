//! What a client may see of the server's errors and notices: source locations and the
//! gateway's own secrets (socket paths, admin names) removed, and every text field bounded.

use bytes::{BufMut, Bytes, BytesMut};

use super::frame::build;
use super::messages::{error_fields, put_cstr};

/// Most bytes of one text field (message, detail, hint, context, …) of an error or notice
/// the client is sent: an agent can make the server put a whole table into one error's
/// DETAIL; past this the field is cut, with a marker saying how much was left out.
pub const MAX_ERROR_FIELD: usize = 4096;

/// Rebuild an ErrorResponse/NoticeResponse without the server's source location fields
/// (F, L, R), with every `secret` replaced in the text fields and every field cut to
/// [`MAX_ERROR_FIELD`] bytes. Returns None when the frame needs no change, so it is relayed
/// as it came.
pub fn scrub_error(tag: u8, body: &[u8], secrets: &[String]) -> Option<Bytes> {
    let fields = error_fields(body)?;
    let mut changed = false;
    let mut b = BytesMut::with_capacity(body.len().min(16 * MAX_ERROR_FIELD));
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
        if v.len() > MAX_ERROR_FIELD {
            v = cut_field(&v, MAX_ERROR_FIELD);
            changed = true;
        }
        put_cstr(&mut b, &v);
    }
    b.put_u8(0);
    changed.then(|| build(tag, &b))
}

/// The first `max` bytes of `v` (fewer, so that no UTF-8 sequence is split; in another
/// encoding, so that the cut follows an ASCII byte), and a marker naming what was cut.
fn cut_field(v: &[u8], max: usize) -> Vec<u8> {
    let mut end = max.min(v.len());
    match std::str::from_utf8(v) {
        Ok(s) => {
            while !s.is_char_boundary(end) {
                end -= 1;
            }
        }
        Err(_) => {
            while end > 0 && v[end - 1] >= 0x80 {
                end -= 1;
            }
        }
    }
    let mut out = v[..end].to_vec();
    out.extend_from_slice(format!(" [sandpit: {} more bytes cut]", v.len() - end).as_bytes());
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::messages::{error_code, error_response, Severity};

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
    fn long_fields_are_cut_whole_characters_first() {
        let detail = "é".repeat(MAX_ERROR_FIELD); // two bytes each
        let e = error_response(Severity::Error, "P0001", "boom");
        let mut body = e[5..e.len() - 1].to_vec();
        body.push(b'D');
        body.extend_from_slice(detail.as_bytes());
        body.extend_from_slice(b"\0\0");
        let out = scrub_error(b'E', &body, &[]).expect("cut");
        let fields = error_fields(&out[5..]).expect("valid");
        let (_, d) = fields.iter().find(|(t, _)| *t == b'D').expect("detail");
        let d = std::str::from_utf8(d).expect("still UTF-8");
        assert!(d.ends_with(&format!("[sandpit: {} more bytes cut]", MAX_ERROR_FIELD)));
        assert!(d.len() < MAX_ERROR_FIELD + 64);
        // Not UTF-8 (a LATIN1 client): cut at an ASCII byte.
        let cut = cut_field(&[b'a', 0xe9, 0xe9, 0xe9], 2);
        assert!(cut.starts_with(b"a ["), "{cut:?}");
        // Short fields stay as they are.
        assert_eq!(error_code(&out[5..]).as_deref(), Some("P0001"));
    }
}
