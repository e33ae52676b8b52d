//! A raw protocol client for tests that send what no client library would: hand-built
//! frontend messages over a blocking socket, and the backend messages read back as they are.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One backend message: its tag and body.
pub type Msg = (u8, Vec<u8>);

/// A logged-in raw session.
pub struct Raw {
    pub s: TcpStream,
    /// BackendKeyData (pid, secret) as the gateway sent it.
    pub key: Option<(i32, i32)>,
}

/// A framed message.
pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn cstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(s);
    out.push(0);
}

/// Query.
pub fn query(q: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, q.as_bytes());
    msg(b'Q', &b)
}

/// Parse (no parameter types).
pub fn parse(name: &str, q: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, name.as_bytes());
    cstr(&mut b, q.as_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'P', &b)
}

/// Bind with no parameters, text results.
pub fn bind(portal: &str, stmt: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal.as_bytes());
    cstr(&mut b, stmt.as_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'B', &b)
}

/// Execute.
pub fn execute(portal: &str, max_rows: i32) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal.as_bytes());
    b.extend_from_slice(&max_rows.to_be_bytes());
    msg(b'E', &b)
}

/// Sync.
pub fn sync() -> Vec<u8> {
    msg(b'S', &[])
}

/// FunctionCall with text arguments and a text result.
pub fn function_call(oid: u32, args: &[&str]) -> Vec<u8> {
    let mut b = oid.to_be_bytes().to_vec();
    b.extend_from_slice(&1i16.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&(args.len() as i16).to_be_bytes());
    for a in args {
        b.extend_from_slice(&(a.len() as i32).to_be_bytes());
        b.extend_from_slice(a.as_bytes());
    }
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'F', &b)
}

/// The SQLSTATE of an ErrorResponse or NoticeResponse body.
pub fn field(body: &[u8], code: u8) -> String {
    let mut i = 0;
    while i < body.len() && body[i] != 0 {
        let t = body[i];
        let end = body[i + 1..]
            .iter()
            .position(|&b| b == 0)
            .map(|p| i + 1 + p)
            .unwrap_or(body.len());
        if t == code {
            return String::from_utf8_lossy(&body[i + 1..end]).into_owned();
        }
        i = end + 1;
    }
    String::new()
}

/// The first column of a DataRow, as text (None for NULL).
pub fn first_column(body: &[u8]) -> Option<String> {
    let len = i32::from_be_bytes(body.get(2..6)?.try_into().ok()?);
    if len < 0 {
        return None;
    }
    Some(String::from_utf8_lossy(body.get(6..6 + len as usize)?).into_owned())
}

/// `<id>.<secret>`, the whole token (the cleartext password of a raw login), from an issued
/// token's DSN (`postgresql://<id>:<secret>@host:port/db`).
pub fn full_token(dsn: &str) -> String {
    let creds = dsn
        .split("://")
        .nth(1)
        .and_then(|s| s.split('@').next())
        .expect("creds in the DSN");
    creds.replacen(':', ".", 1)
}

impl Raw {
    /// Connect to the gateway on 127.0.0.1:`port` and log in with the whole token
    /// (`<id>.<secret>`) as a cleartext password (allowed on loopback).
    pub fn login(port: u16, full_token: &str) -> Raw {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("timeout");
        let mut body = 196608u32.to_be_bytes().to_vec();
        for (k, v) in [("user", "agent"), ("database", "sandpit")] {
            cstr(&mut body, k.as_bytes());
            cstr(&mut body, v.as_bytes());
        }
        body.push(0);
        let mut startup = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        startup.extend(body);
        s.write_all(&startup).expect("startup");
        let mut raw = Raw { s, key: None };
        let (tag, _) = raw.read().expect("auth request");
        assert_eq!(tag, b'R');
        let mut pw = full_token.as_bytes().to_vec();
        pw.push(0);
        raw.send(&msg(b'p', &pw));
        loop {
            let (tag, body) = raw.read().expect("login response");
            match tag {
                b'K' if body.len() == 8 => {
                    let pid = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                    let secret = i32::from_be_bytes([body[4], body[5], body[6], body[7]]);
                    raw.key = Some((pid, secret));
                }
                b'Z' => return raw,
                b'E' => panic!("login failed: {}", field(&body, b'C')),
                _ => {}
            }
        }
    }

    /// Send bytes as they are.
    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("send");
    }

    /// One backend message; None on EOF.
    pub fn read(&mut self) -> Option<Msg> {
        let mut head = [0u8; 5];
        self.s.read_exact(&mut head).ok()?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        assert!((4..1 << 28).contains(&len), "gateway sent length {len}");
        let mut body = vec![0u8; len - 4];
        self.s.read_exact(&mut body).ok()?;
        Some((head[0], body))
    }

    /// Messages up to and including the next ReadyForQuery.
    pub fn until_ready(&mut self) -> Vec<Msg> {
        let mut out = Vec::new();
        loop {
            let m = self.read().expect("response before ReadyForQuery");
            let done = m.0 == b'Z';
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// Messages up to and including the next one with `tag`.
    pub fn until(&mut self, tag: u8) -> Vec<Msg> {
        let mut out = Vec::new();
        loop {
            let m = self.read().expect("response");
            let done = m.0 == tag;
            out.push(m);
            if done {
                return out;
            }
        }
    }
}

/// Rows of each result in a response stream (DataRows between a RowDescription or the
/// start of an Execute and its CommandComplete / PortalSuspended).
pub fn rows_per_result(msgs: &[Msg]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut n = 0;
    for (tag, _) in msgs {
        match tag {
            b'D' => n += 1,
            b'C' | b's' | b'I' => {
                out.push(n);
                n = 0;
            }
            _ => {}
        }
    }
    out
}

/// Send a CancelRequest for `key` to the gateway on 127.0.0.1:`port`.
pub fn cancel(port: u16, key: (i32, i32)) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut m = 16u32.to_be_bytes().to_vec();
    m.extend_from_slice(&80877102u32.to_be_bytes());
    m.extend_from_slice(&key.0.to_be_bytes());
    m.extend_from_slice(&key.1.to_be_bytes());
    c.write_all(&m).expect("cancel");
    let mut sink = Vec::new();
    let _ = c.read_to_end(&mut sink);
}
