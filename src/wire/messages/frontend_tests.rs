//! Tests of the frontend message views (`messages::frontend`).
use super::frontend::*;

/// Bind values as (format code, bytes or NULL).
type Values<'a> = Vec<(i16, Option<&'a [u8]>)>;

/// The parse this view replaced (values collected into a Vec), kept as the reference.
fn values_reference(rest: &[u8]) -> Option<Values<'_>> {
    let i16_at = |at: usize| Some(i16::from_be_bytes([*rest.get(at)?, *rest.get(at + 1)?]));
    let i32_at = |at: usize| {
        Some(i32::from_be_bytes([
            *rest.get(at)?,
            *rest.get(at + 1)?,
            *rest.get(at + 2)?,
            *rest.get(at + 3)?,
        ]))
    };
    // Counts are unsigned, as the server reads them.
    let u16_at = |at: usize| Some(u16::from_be_bytes([*rest.get(at)?, *rest.get(at + 1)?]));
    let nfmt = u16_at(0)?;
    let mut at = 2;
    let mut formats = Vec::new();
    for _ in 0..nfmt {
        formats.push(i16_at(at)?);
        at += 2;
    }
    let n = u16_at(at)?;
    at += 2;
    let mut values = Vec::new();
    for i in 0..n as usize {
        let len = i32_at(at)?;
        at += 4;
        let fmt = match formats.as_slice() {
            [] => 0,
            [only] => *only,
            many => *many.get(i)?,
        };
        if len < 0 {
            values.push((fmt, None));
        } else {
            let end = at.checked_add(len as usize)?;
            values.push((fmt, Some(rest.get(at..end)?)));
            at = end;
        }
    }
    Some(values)
}

#[test]
fn the_in_place_values_agree_with_the_collected_ones() {
    let mut seed: u64 = 0xb1d;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as u32
    };
    for _ in 0..50_000 {
        // Mostly well-formed: a few formats, a few values, lengths sometimes wrong.
        let mut rest = Vec::new();
        let nfmt = [0i16, 1, 2, 3, -1][next() as usize % 5];
        rest.extend_from_slice(&nfmt.to_be_bytes());
        for _ in 0..nfmt.clamp(0, 3) {
            rest.extend_from_slice(&((next() % 3) as i16).to_be_bytes());
        }
        let n = [0i16, 1, 2, 3, -2][next() as usize % 5];
        rest.extend_from_slice(&n.to_be_bytes());
        for _ in 0..n.clamp(0, 3) {
            let len: i32 = match next() % 6 {
                0 => -1,
                1 => -7,
                2 => 1_000,
                _ => (next() % 5) as i32,
            };
            rest.extend_from_slice(&len.to_be_bytes());
            for _ in 0..len.clamp(0, 8) {
                rest.push(next() as u8);
            }
        }
        let cut = match next() % 4 {
            0 => rest.len().saturating_sub((next() % 4) as usize),
            _ => rest.len(),
        };
        let rest = &rest[..cut];
        let mut body = b"p\0s\0".to_vec();
        body.extend_from_slice(rest);
        let new = bind(&body).map(|b| b.params.iter().collect::<Vec<_>>());
        assert_eq!(new, values_reference(rest), "{rest:?}");
    }
}

#[test]
fn bind_views_are_bounded() {
    let mut body = b"p\0s\0".to_vec();
    body.extend_from_slice(&[0, 1, 0, 1]); // one format code: binary
    body.extend_from_slice(&[0, 2]); // two params
    body.extend_from_slice(&[0, 0, 0, 2, 0xab, 0xcd]);
    body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    body.extend_from_slice(&[0, 0]);
    let b = bind(&body).unwrap();
    assert_eq!(b.portal, b"p");
    assert_eq!(
        b.params.iter().collect::<Vec<_>>(),
        vec![(1, Some(&[0xab, 0xcd][..])), (1, None)]
    );
    // A length past the end of the message is refused, not trusted.
    let mut bad = b"\0\0".to_vec();
    bad.extend_from_slice(&[0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff, 1]);
    assert!(bind(&bad).is_none());
    assert!(bind(b"\0\0\xff\xff").is_none());
    assert_eq!(execute(b"\0\0\0\0\x05"), Some((&b""[..], 5)));
    assert!(execute(b"\0\0").is_none());
    assert_eq!(target(b"Sname\0"), Some((b'S', &b"name"[..])));
    assert!(target(b"Xname\0").is_none());
}

#[test]
fn command_complete_in_place_is_the_same_message() {
    for tag in ["", "SELECT 1", "INSERT 0 3", "COPY 18446744073709551615"] {
        let mut out = bytes::BytesMut::from(&b"before"[..]);
        super::put_command_complete(&mut out, tag);
        assert_eq!(&out[6..], &super::command_complete(tag)[..], "{tag}");
    }
}

#[test]
fn counts_are_unsigned_as_the_server_reads_them() {
    // pgx sends up to 65,535 parameters: 40,000 is a count a signed read takes as negative.
    let n: u16 = 40_000;
    let mut body = b"\0\0".to_vec();
    body.extend_from_slice(&[0, 0]); // no format codes: all text
    body.extend_from_slice(&n.to_be_bytes());
    for _ in 0..n {
        body.extend_from_slice(&[0, 0, 0, 1, b'x']);
    }
    body.extend_from_slice(&[0, 0]); // result formats
    let b = bind(&body).expect("a Bind of 40,000 parameters");
    assert_eq!(b.params.len(), 40_000);
    assert!(b.params.iter().all(|v| v == (0, Some(&b"x"[..]))));
    assert_eq!(bind_names(&body), Some((&b""[..], &b""[..])));
    // The count still bounds the read: one value short is refused.
    assert!(bind(&body[..body.len() - 7]).is_none());
}
