//! Untagged startup-phase packets: SSLRequest, GSSENCRequest, CancelRequest, StartupMessage.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Protocol code of an SSLRequest.
pub const SSL_REQUEST: u32 = 80877103;
/// Protocol code of a GSSENCRequest.
pub const GSSENC_REQUEST: u32 = 80877104;
/// Protocol code of a CancelRequest.
pub const CANCEL_REQUEST: u32 = 80877102;
/// Protocol version 3.0.
pub const PROTOCOL_3_0: u32 = 196608;

/// A startup-phase failure; the connection is closed (with an 08P01 error where possible).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("invalid startup packet length {0}")]
    BadLength(u32),
    #[error("startup packet is malformed: {0}")]
    Malformed(&'static str),
    #[error("unsupported frontend protocol {major}.{minor}: server supports 3.0")]
    UnsupportedProtocol { major: u16, minor: u16 },
    #[error("direct TLS connection without the ALPN protocol \"postgresql\"")]
    DirectTlsWithoutAlpn,
    #[error("connection closed during startup")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// One packet of the startup phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    /// Client asks for TLS.
    SslRequest,
    /// Client asks for GSSAPI encryption.
    GssEncRequest,
    /// Cancel the query of the session with this key.
    CancelRequest { pid: i32, secret: i32 },
    /// The real startup message.
    Startup(StartupMessage),
}

/// A StartupMessage: protocol version and parameters, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupMessage {
    /// Requested major version (3).
    pub major: u16,
    /// Requested minor version (0 or more; >0 is negotiated down).
    pub minor: u16,
    /// Parameters in the order sent. Values are raw bytes: with a `client_encoding` other
    /// than UTF-8 (LATIN1, say) an `application_name` is not UTF-8, and it is relayed as is.
    pub params: Vec<(String, Vec<u8>)>,
}

impl StartupMessage {
    /// Value of a parameter, when it is UTF-8 (None when absent or not UTF-8).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.get_raw(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Raw value of a parameter.
    pub fn get_raw(&self, key: &str) -> Option<&[u8]> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
    }
}

/// Read one startup packet; `max_len` bounds it (default 10 KB) before anything is allocated.
pub async fn read_startup<R: AsyncRead + Unpin>(
    r: &mut R,
    max_len: u32,
) -> Result<StartupPacket, StartupError> {
    let mut head = [0u8; 4];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(StartupError::Closed)
        }
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(head);
    if !(8..=max_len).contains(&len) {
        return Err(StartupError::BadLength(len));
    }
    let mut body = vec![0u8; len as usize - 4];
    match r.read_exact(&mut body).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(StartupError::Closed)
        }
        Err(e) => return Err(e.into()),
    }
    parse_startup(&body)
}

/// Parse the body of a startup packet (everything after the length).
pub fn parse_startup(body: &[u8]) -> Result<StartupPacket, StartupError> {
    if body.len() < 4 {
        return Err(StartupError::Malformed("too short"));
    }
    let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    let rest = &body[4..];
    match code {
        SSL_REQUEST if rest.is_empty() => Ok(StartupPacket::SslRequest),
        GSSENC_REQUEST if rest.is_empty() => Ok(StartupPacket::GssEncRequest),
        CANCEL_REQUEST if rest.len() == 8 => Ok(StartupPacket::CancelRequest {
            pid: i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]),
            secret: i32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]),
        }),
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => {
            Err(StartupError::Malformed("wrong length for request"))
        }
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Err(StartupError::UnsupportedProtocol { major, minor });
            }
            Ok(StartupPacket::Startup(StartupMessage {
                major,
                minor,
                params: parse_params(rest)?,
            }))
        }
    }
}

fn parse_params(mut rest: &[u8]) -> Result<Vec<(String, Vec<u8>)>, StartupError> {
    let mut params = Vec::new();
    loop {
        let (key, after) = cstr(rest)?;
        if key.is_empty() {
            if !after.is_empty() {
                return Err(StartupError::Malformed("bytes after the parameter list"));
            }
            return Ok(params);
        }
        let (value, after) = cstr(after)?;
        let key = String::from_utf8(key.to_vec())
            .map_err(|_| StartupError::Malformed("parameter name is not UTF-8"))?;
        // Values may be in the client's encoding (a LATIN1 application_name): kept as bytes,
        // never re-encoded, so the backend sees exactly what the client sent.
        if params.len() >= 64 {
            return Err(StartupError::Malformed("too many parameters"));
        }
        params.push((key, value.to_vec()));
        rest = after;
    }
}

fn cstr(b: &[u8]) -> Result<(&[u8], &[u8]), StartupError> {
    let end = b
        .iter()
        .position(|&c| c == 0)
        .ok_or(StartupError::Malformed("unterminated string"))?;
    Ok((&b[..end], &b[end + 1..]))
}

/// Encode a StartupMessage (used towards the backend). Values are bytes (`&str` works too).
pub fn encode_startup<V: AsRef<[u8]>>(params: &[(&str, V)]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&PROTOCOL_3_0.to_be_bytes());
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_ref());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Encode a CancelRequest (used towards the backend).
pub fn encode_cancel(pid: i32, secret: i32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&16u32.to_be_bytes());
    out[4..8].copy_from_slice(&CANCEL_REQUEST.to_be_bytes());
    out[8..12].copy_from_slice(&pid.to_be_bytes());
    out[12..].copy_from_slice(&secret.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_startup_and_requests() {
        let pkt = encode_startup(&[("user", "u"), ("database", "d")]);
        match parse_startup(&pkt[4..]).unwrap() {
            StartupPacket::Startup(m) => {
                assert_eq!(m.get("user"), Some("u"));
                assert_eq!(m.get("database"), Some("d"));
            }
            other => panic!("{other:?}"),
        }
        let c = encode_cancel(7, 9);
        assert_eq!(
            parse_startup(&c[4..]).unwrap(),
            StartupPacket::CancelRequest { pid: 7, secret: 9 }
        );
        assert_eq!(
            parse_startup(&SSL_REQUEST.to_be_bytes()).unwrap(),
            StartupPacket::SslRequest
        );
        assert!(parse_startup(&[0, 3, 0, 0, b'u', 0]).is_err());
        assert!(parse_startup(&[0, 2, 0, 0, 0]).is_err());
        assert!(parse_startup(&[1]).is_err());
    }

    #[test]
    fn non_utf8_values_are_kept_as_bytes() {
        // application_name "caf\xe9" in LATIN1.
        let pkt = encode_startup(&[
            ("user", &b"u"[..]),
            ("client_encoding", b"LATIN1"),
            ("application_name", b"caf\xe9"),
        ]);
        let StartupPacket::Startup(m) = parse_startup(&pkt[4..]).unwrap() else {
            panic!("not a startup message")
        };
        assert_eq!(m.get_raw("application_name"), Some(&b"caf\xe9"[..]));
        assert_eq!(m.get("application_name"), None);
        assert_eq!(m.get("client_encoding"), Some("LATIN1"));
        // Encoding it again gives the same bytes.
        let again: Vec<(&str, &[u8])> = m
            .params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        assert_eq!(encode_startup(&again), pkt);
    }

    #[tokio::test]
    async fn length_is_bounded_before_allocation() {
        let data = [0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0];
        let mut r = &data[..];
        assert!(matches!(
            read_startup(&mut r, 10_000).await,
            Err(StartupError::BadLength(_))
        ));
    }
}
