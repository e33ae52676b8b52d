//! The fuzz target bodies, shared by the cargo-fuzz binaries (`fuzz/fuzz_targets/`) and the
//! stable-toolchain smoke test (`tests/checks/fuzz_smoke.rs`, which includes this file by path).
//! Each takes arbitrary bytes and must never panic.

use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use sandpit::auth::{ScramServer, Verifier};
use sandpit::journal::classify;
use sandpit::proxy::caps::{CapMode, CapPolicy};
use sandpit::proxy::pipeline::{Pipeline, SessionIdentity};
use sandpit::wire::frame::{Frame, FrameReader};
use sandpit::wire::messages::{self, frontend};
use sandpit::wire::startup;

/// Split `data` in two at a point given by its first two bytes.
fn halves(data: &[u8]) -> (&[u8], &[u8]) {
    if data.len() < 2 {
        return (data, &[]);
    }
    let at = u16::from_be_bytes([data[0], data[1]]) as usize;
    let rest = &data[2..];
    let at = at.min(rest.len());
    rest.split_at(at)
}

/// Every frame the framing layer finds in `bytes` (stops at the first framing error).
fn frames(bytes: &[u8], max_len: usize) -> Vec<Frame> {
    let mut r = FrameReader::with_buffer(tokio::io::empty(), BytesMut::from(bytes), max_len);
    let mut out = Vec::new();
    while let Ok(Some(f)) = r.try_frame() {
        out.push(f);
    }
    out
}

/// Startup packet parsing (the body after the length word).
pub fn startup(data: &[u8]) {
    if let Ok(startup::StartupPacket::Startup(m)) = startup::parse_startup(data) {
        let _ = m.get("user");
        let _ = m.get("options");
    }
}

/// Frontend framing and every typed view of a frontend message body.
pub fn frontend(data: &[u8]) {
    for f in frames(data, 1 << 20) {
        let b = f.body();
        let _ = frontend::parse(b);
        if let Some(bind) = frontend::bind(b) {
            for (fmt, v) in &bind.params {
                let _ = (fmt, v.map(<[u8]>::len));
            }
        }
        let _ = frontend::execute(b);
        let _ = frontend::target(b);
        let _ = messages::sasl_initial_response(b);
        let _ = messages::password_message(b);
        let _ = messages::error_fields(b);
        let _ = messages::error_code(b);
        let _ = messages::command_tag(b);
        let _ = sandpit::wire::scrub::scrub_error(b'E', b, &["/secret/path".to_string()]);
    }
}

fn verifier() -> &'static Verifier {
    static V: OnceLock<Verifier> = OnceLock::new();
    V.get_or_init(|| Verifier::from_secret("fuzz-secret"))
}

/// The SCRAM server: client-first, then client-final. `@NONCE@` in the second half is
/// replaced by the nonce the server chose, so inputs can get past the nonce check.
pub fn scram(data: &[u8]) {
    let (first, fin) = halves(data);
    let Ok((state, server_first)) = ScramServer::start(&verifier().scram, first) else {
        return;
    };
    let sf = String::from_utf8_lossy(&server_first).into_owned();
    let nonce = sf
        .split(',')
        .find_map(|p| p.strip_prefix("r="))
        .unwrap_or("")
        .to_string();
    let fin = String::from_utf8_lossy(fin).replace("@NONCE@", &nonce);
    let _ = state.finish(fin.as_bytes());
}

/// The relay's protocol state machine: client frames, then backend frames in pieces,
/// with the outbox drained in between, as the relay does.
pub fn pipeline(data: &[u8]) {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let (client, backend) = halves(data);
    let mut pl = Pipeline::new(SessionIdentity {
        token: "sp_fuzz".into(),
        task: "fuzz".into(),
        session: 1,
        log: None::<Arc<_>>,
        caps: CapPolicy {
            max_rows: u64::from(mode & 0x0f) + 1,
            max_bytes: 64 + u64::from(mode >> 4) * 64,
            mode: if mode & 1 == 0 {
                CapMode::Truncate
            } else {
                CapMode::Error
            },
        },
        // Half the inputs also run under a seatbelt policy (refusals rewrite messages).
        allow: (mode & 2 != 0).then(|| vec!["read".to_string(), "transaction".to_string()]),
    });
    let secrets = ["/var/lib/secret".to_string(), "sandpit_admin".to_string()];
    let mut to_backend = BytesMut::new();
    let mut to_client = BytesMut::new();
    for f in frames(client, 1 << 20) {
        pl.on_client(f);
        pl.drain_outbox(&mut to_backend);
    }
    for f in frames(backend, 1 << 20) {
        pl.on_backend(f, &mut to_client, &secrets);
        pl.drain_outbox(&mut to_backend);
    }
    let _ = pl.blocked();
    // Whatever the gateway produced must itself be well framed.
    for (bytes, name) in [(&to_backend, "to backend"), (&to_client, "to client")] {
        let mut r = FrameReader::with_buffer(tokio::io::empty(), bytes.clone(), 1 << 30);
        let mut seen = 0;
        while let Ok(Some(f)) = r.try_frame() {
            seen += f.raw.len();
        }
        assert_eq!(
            seen,
            bytes.len(),
            "gateway output {name} is not whole frames"
        );
    }
}

/// Row and byte counts of the result the client is receiving now.
#[derive(Default)]
struct Delivered {
    rows: u64,
    bytes: u64,
    /// The last RowDescription the client saw has only catalog columns: such results are
    /// not cut by the row cap (a driver's catalog query), only by the byte cap.
    catalog: bool,
}

impl Delivered {
    /// Account one frame the client received; panics when a result goes past the caps.
    /// A result, as the client can count it, is everything between two completion messages
    /// (CommandComplete, EmptyQueryResponse, PortalSuspended, ErrorResponse,
    /// ReadyForQuery, FunctionCallResponse): a RowDescription is not needed to read rows.
    /// Past the row cap is allowed only for a write's RETURNING rows (the CommandComplete
    /// that ends them carries a write's tag) and for catalog results.
    fn see(&mut self, f: &Frame, caps: &CapPolicy, trace: &[(&str, Bytes)]) {
        let over = |d: &Delivered, why: &str| {
            panic!(
                "the client got {} rows / {} bytes in one result over caps of {} rows / {} \
                 bytes ({:?}, {why}); messages so far:\n{}",
                d.rows,
                d.bytes,
                caps.max_rows,
                caps.max_bytes,
                caps.mode,
                show(trace)
            )
        };
        match f.tag {
            b'T' => self.catalog = sandpit::wire::messages::reads_only_catalogs(f.body()),
            b'D' | b'd' => {
                if f.tag == b'D' {
                    self.rows += 1;
                }
                self.bytes += f.raw.len() as u64;
                if self.bytes > caps.max_bytes {
                    over(self, "bytes");
                }
            }
            b'C' | b'I' | b's' | b'E' | b'Z' | b'V' => {
                let write_tag = f.tag == b'C'
                    && ["INSERT", "UPDATE", "DELETE", "MERGE"]
                        .iter()
                        .any(|w| f.body().starts_with(w.as_bytes()));
                if self.rows > caps.max_rows && !self.catalog && !write_tag {
                    over(self, "rows");
                }
                self.rows = 0;
                self.bytes = 0;
            }
            _ => {}
        }
    }
}

/// The messages of a failing input, one a line, for the panic message.
fn show(trace: &[(&str, Bytes)]) -> String {
    let mut s = String::new();
    for (who, raw) in trace {
        let body = raw.get(5..).unwrap_or(&[]);
        s.push_str(&format!(
            "{who} {:?} {:?}\n",
            raw[0] as char,
            String::from_utf8_lossy(body)
        ));
    }
    s
}

/// One message of a `pipeline_caps` input: which side sent it, and whether the relay
/// drains its outbox after it (it does so only between batches).
fn next_item(data: &[u8]) -> Option<(u8, Frame, usize)> {
    let (&dir, rest) = data.split_first()?;
    let mut r = FrameReader::with_buffer(tokio::io::empty(), BytesMut::from(rest), 1 << 20);
    let f = r.try_frame().ok()??;
    let used = 1 + f.raw.len();
    Some((dir, f, used))
}

/// The cap invariant: whatever the client and the backend send, in any interleaving, no
/// result reaches the client with more rows than max_rows or more row bytes than
/// max_bytes. The first byte gives the caps (as in [`pipeline`]); then each message is a
/// direction byte (bit 0: from the backend; bit 1: no outbox drain after it) and a frame.
pub fn pipeline_caps(data: &[u8]) {
    let Some((&mode, mut data)) = data.split_first() else {
        return;
    };
    let caps = CapPolicy {
        max_rows: u64::from(mode & 0x0f) + 1,
        max_bytes: 64 + u64::from(mode >> 4) * 64,
        mode: if mode & 1 == 0 {
            CapMode::Truncate
        } else {
            CapMode::Error
        },
    };
    let mut pl = Pipeline::new(SessionIdentity {
        token: "sp_fuzz".into(),
        task: "fuzz".into(),
        session: 1,
        log: None::<Arc<_>>,
        caps,
        allow: (mode & 2 != 0).then(|| vec!["read".to_string(), "transaction".to_string()]),
    });
    let mut to_backend = BytesMut::new();
    let mut to_client = BytesMut::new();
    let mut seen = Delivered::default();
    // What happened, for the panic message.
    let mut trace: Vec<(&str, Bytes)> = Vec::new();
    while let Some((dir, f, used)) = next_item(data) {
        data = &data[used..];
        let from_backend = dir & 1 == 1;
        let who = if from_backend {
            "backend →"
        } else {
            "client  →"
        };
        trace.push((who, f.raw.clone()));
        if from_backend {
            pl.on_backend(f, &mut to_client, &[]);
            let _ = pl.take_ignored_syncs();
        } else {
            pl.on_client(f);
        }
        if dir & 2 == 0 {
            pl.drain_outbox(&mut to_backend);
        }
        let mut r = FrameReader::with_buffer(tokio::io::empty(), to_client.split(), 1 << 30);
        while let Ok(Some(out)) = r.try_frame() {
            trace.push(("    client sees", out.raw.clone()));
            seen.see(&out, &caps, &trace);
        }
        assert_eq!(
            r.buffered(),
            0,
            "gateway output to the client is not whole frames"
        );
    }
}

/// The statement classifier and splitter.
pub fn classify(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = classify::classify(&text);
    let _ = classify::from_keywords(&text);
    let _ = classify::returning(&text);
    if let Some(pieces) = classify::split(&text) {
        for p in pieces {
            let _ = classify::may_return_rows(p);
            let _ = classify::classify(p);
        }
    }
}

/// A target's body: one input, no result (a panic is the finding).
pub type Body = fn(&[u8]);

/// All targets by name.
pub const TARGETS: &[(&str, Body)] = &[
    ("startup", startup),
    ("frontend", frontend),
    ("scram", scram),
    ("pipeline", pipeline),
    ("pipeline_caps", pipeline_caps),
    ("classify", classify),
];
