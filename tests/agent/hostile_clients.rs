//! Hostile clients against the real gateway: oversized and garbage messages at every
//! protocol phase, silence, slow reading, guessing secrets. Each closes (or refuses) only
//! that connection, and a well-behaved session running alongside keeps working.

use crate::support::harness;
use crate::support::wire;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::support::harness::{connect, Gateway};
use serde_json::Value;
use wire::msg;

const GOLDEN: &str = "create table items(id int primary key, name text not null);\n\
insert into items select g, 'item ' || g from generate_series(1, 1000) g;\n";

const CONFIG: &str = "[limits]\nstartup_timeout = \"3s\"\nauth_failures_per_minute = 5\n\
[tokens]\nmax_bytes_limit = 67108864\n";

fn gw() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| harness::process_gateway(|| Gateway::start(Some(GOLDEN), Some(CONFIG))))
}

fn gateway_pid() -> u32 {
    gw().child.as_ref().expect("own child").id()
}

/// Resident memory of the gateway process, in KiB.
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{}/status", gateway_pid())).expect("status");
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

/// `<id>.<secret>`: the whole token, as the cleartext password.
fn full_token(v: &Value) -> String {
    crate::support::wire::full_token(&dsn(v))
}

/// A well-behaved session querying in a loop on its own thread for the whole test.
struct Bystander {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Bystander {
    fn start() -> Bystander {
        let t = gw().issue("bystander", 600);
        let dsn = dsn(&t);
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let (s, o) = (stop.clone(), ok.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let c = connect(&dsn).await.map_err(|e| e.to_string())?;
                while !s.load(Ordering::Relaxed) {
                    let row = c
                        .query_one("select count(*) from items", &[])
                        .await
                        .map_err(|e| format!("bystander query failed: {e}"))?;
                    if row.get::<_, i64>(0) != 1000 {
                        return Err("bystander saw wrong data".into());
                    }
                    o.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(())
            })
        });
        // Wait for its first query so it is live before the hostile part starts.
        harness::wait_until(Duration::from_secs(60), || ok.load(Ordering::Relaxed) > 0);
        Bystander {
            stop,
            ok,
            thread: Some(thread),
        }
    }

    fn finish(mut self) {
        let before = self.ok.load(Ordering::Relaxed);
        // It must still make progress after everything the test did.
        assert!(
            harness::wait_until(Duration::from_secs(30), || self.ok.load(Ordering::Relaxed)
                > before),
            "bystander stalled"
        );
        self.stop.store(true, Ordering::Relaxed);
        let r = self.thread.take().expect("thread").join().expect("join");
        assert_eq!(r, Ok(()), "the well-behaved session failed");
        eprintln!("bystander ran {} queries", self.ok.load(Ordering::Relaxed));
    }
}

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], gw().pg_port))
}

fn raw() -> TcpStream {
    let s = TcpStream::connect(addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    s
}

fn startup(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = 196608u32.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

/// Read one backend message; None on EOF or a read error.
fn read_msg(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    assert!((4..1 << 26).contains(&len), "gateway sent length {len}");
    let mut body = vec![0u8; len - 4];
    s.read_exact(&mut body).ok()?;
    Some((head[0], body))
}

fn error_code(body: &[u8]) -> String {
    wire::field(body, b'C')
}

/// Read until an ErrorResponse (its SQLSTATE) or EOF (None).
fn next_error(s: &mut TcpStream) -> Option<String> {
    while let Some((tag, body)) = read_msg(s) {
        if tag == b'E' {
            return Some(error_code(&body));
        }
    }
    None
}

/// True when the peer has closed (EOF or reset) within the read timeout.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Log in with a cleartext password (allowed on loopback) and read up to ReadyForQuery.
fn login(token: &Value) -> TcpStream {
    let mut s = raw();
    s.write_all(&startup(&[("user", "agent"), ("database", "sandpit")]))
        .expect("startup");
    let (tag, body) = read_msg(&mut s).expect("auth request");
    assert_eq!(
        (tag, &body[..4]),
        (b'R', &3i32.to_be_bytes()[..]),
        "cleartext asked"
    );
    let mut pw = full_token(token).into_bytes();
    pw.push(0);
    s.write_all(&msg(b'p', &pw)).expect("password");
    loop {
        let (tag, body) = read_msg(&mut s).expect("login response");
        match tag {
            b'Z' => return s,
            b'E' => panic!("login failed: {}", error_code(&body)),
            _ => {}
        }
    }
}

fn query(s: &mut TcpStream, q: &str) -> Vec<(u8, Vec<u8>)> {
    let mut body = q.as_bytes().to_vec();
    body.push(0);
    s.write_all(&msg(b'Q', &body)).expect("query");
    let mut out = Vec::new();
    loop {
        let m = read_msg(s).expect("response");
        let done = m.0 == b'Z';
        out.push(m);
        if done {
            return out;
        }
    }
}

#[test]
fn an_oversized_message_is_refused_before_anything_is_allocated() {
    let by = Bystander::start();
    let t = gw().issue("oversized", 600);
    for _ in 0..3 {
        let mut s = login(&t);
        let before = rss_kib();
        // A Query claiming 1 GiB, followed by a little of it. The 08P01 arrives while
        // almost all of the message is still unsent, so the gateway judged the header alone;
        // RSS is the coarse second check (an untouched allocation would not show in it).
        let mut m = vec![b'Q'];
        m.extend_from_slice(&(1u32 << 30).to_be_bytes());
        m.extend_from_slice(&[b'x'; 1024]);
        let _ = s.write_all(&m);
        assert_eq!(next_error(&mut s).as_deref(), Some("08P01"));
        assert!(closed(&mut s));
        let after = rss_kib();
        assert!(
            after < before + 32 * 1024,
            "gateway RSS grew from {before} KiB to {after} KiB"
        );
    }
    // Startup packets are bounded at 10 KiB.
    let mut s = raw();
    let _ = s.write_all(&(1u32 << 30).to_be_bytes());
    assert_eq!(next_error(&mut s).as_deref(), Some("08P01"));
    let mut s = raw();
    let big = "x".repeat(20_000);
    let _ = s.write_all(&startup(&[("user", "agent"), ("application_name", &big)]));
    assert_eq!(next_error(&mut s).as_deref(), Some("08P01"));
    by.finish();
}

#[test]
fn a_silent_or_stalled_client_is_closed_after_the_startup_timeout() {
    let by = Bystander::start();
    // Sends nothing at all.
    let mut silent = raw();
    // Sends half a startup packet.
    let mut half = raw();
    half.write_all(&100u32.to_be_bytes()).expect("half");
    // Authenticates half-way (asked for a password, never sends it).
    let mut mute = raw();
    mute.write_all(&startup(&[("user", "agent")]))
        .expect("startup");
    assert_eq!(read_msg(&mut mute).map(|m| m.0), Some(b'R'));
    for s in [&mut silent, &mut half, &mut mute] {
        // The read timeout is 20 s; the gateway's startup timeout is 3 s.
        assert!(closed(s), "connection left open");
    }
    by.finish();
}

#[test]
fn garbage_at_every_phase_closes_only_that_connection() {
    let by = Bystander::start();
    let t = gw().issue("garbage", 600);
    let id = t["id"].as_str().expect("id").to_string();

    // Startup: an impossible length, a wrong protocol, an unterminated parameter list,
    // a truncated packet.
    for bytes in [
        vec![0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4],
        {
            let mut v = startup(&[("user", "agent")]);
            v[4..8].copy_from_slice(&0x0002_0000u32.to_be_bytes());
            v
        },
        {
            let mut v = 20u32.to_be_bytes().to_vec();
            v.extend_from_slice(&196608u32.to_be_bytes());
            v.extend_from_slice(b"user\0agent");
            v.extend_from_slice(&[b'x'; 2]);
            v
        },
    ] {
        let mut s = raw();
        let _ = s.write_all(&bytes);
        let code = next_error(&mut s);
        assert!(
            matches!(code.as_deref(), Some("08P01") | Some("0A000")),
            "startup garbage: {code:?}"
        );
        assert!(closed(&mut s));
    }
    let mut s = raw();
    let _ = s.write_all(&startup(&[("user", "agent")])[..10]);
    drop(s); // truncated and gone: nothing to answer, nothing may break

    // Auth (SCRAM): garbage instead of SASLInitialResponse; a Query instead; a negative length.
    for bytes in [
        msg(b'p', b"\xff\xfe garbage"),
        msg(b'p', b"SCRAM-SHA-256\0\xff\xff\xff\x7fxx"),
        msg(b'Q', b"select 1\0"),
        vec![b'p', 0xff, 0xff, 0xff, 0xfb],
    ] {
        let mut s = raw();
        s.write_all(&startup(&[("user", &id)])).expect("startup");
        let (tag, _) = read_msg(&mut s).expect("sasl request");
        assert_eq!(tag, b'R');
        let _ = s.write_all(&bytes);
        let code = next_error(&mut s);
        assert!(
            matches!(code.as_deref(), Some("08P01") | Some("28P01")),
            "auth garbage: {code:?}"
        );
        assert!(closed(&mut s));
    }

    // After auth: messages Postgres itself handles get its own error and the session goes on.
    let mut s = login(&t);
    // Bind referencing nothing.
    let mut bind = b"\0nope\0".to_vec();
    bind.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    s.write_all(&[msg(b'B', &bind), msg(b'S', b"")].concat())
        .expect("bind");
    assert_eq!(next_error(&mut s).as_deref(), Some("26000"));
    assert_eq!(read_msg(&mut s).map(|m| m.0), Some(b'Z'));
    // Binds of a statement that exists, with counts that lie: 32767 values announced and
    // one sent; two formats for three values; a value length past the message's end; and
    // 32767 NULLs really sent. The gateway relays what it cannot read and logs what it can;
    // Postgres refuses each (08P01) and the session goes on.
    s.write_all(&[msg(b'P', b"s1\0select $1::int\0\0\0"), msg(b'S', b"")].concat())
        .expect("parse");
    assert_eq!(read_msg(&mut s).map(|m| m.0), Some(b'1'));
    assert_eq!(read_msg(&mut s).map(|m| m.0), Some(b'Z'));
    let lying = |formats: &[i16], n: i16, values: &[u8]| {
        let mut b = b"\0s1\0".to_vec();
        b.extend_from_slice(&(formats.len() as i16).to_be_bytes());
        for f in formats {
            b.extend_from_slice(&f.to_be_bytes());
        }
        b.extend_from_slice(&n.to_be_bytes());
        b.extend_from_slice(values);
        b.extend_from_slice(&[0, 0]);
        b
    };
    let nulls: Vec<u8> = (0..i16::MAX).flat_map(|_| (-1i32).to_be_bytes()).collect();
    for bind in [
        lying(&[], i16::MAX, &[0, 0, 0, 1, b'7']),
        lying(
            &[0, 0],
            3,
            &[0, 0, 0, 1, b'7', 0, 0, 0, 1, b'8', 0, 0, 0, 1, b'9'],
        ),
        lying(&[], 1, &[0x7f, 0xff, 0xff, 0xff, b'7']),
        lying(&[], i16::MAX, &nulls),
    ] {
        s.write_all(&[msg(b'B', &bind), msg(b'E', b"\0\0\0\0\0"), msg(b'S', b"")].concat())
            .expect("lying bind");
        assert_eq!(next_error(&mut s).as_deref(), Some("08P01"));
        assert_eq!(read_msg(&mut s).map(|m| m.0), Some(b'Z'));
    }
    // Execute of a portal that does not exist (out of order).
    s.write_all(&[msg(b'E', b"ghost\0\0\0\0\0"), msg(b'S', b"")].concat())
        .expect("execute");
    assert_eq!(next_error(&mut s).as_deref(), Some("34000"));
    assert_eq!(read_msg(&mut s).map(|m| m.0), Some(b'Z'));
    // Close of nothing and a stray CopyDone are harmless.
    s.write_all(&[msg(b'c', b""), msg(b'C', b"Snope\0"), msg(b'S', b"")].concat())
        .expect("close");
    let (tag, _) = read_msg(&mut s).expect("close complete");
    assert_eq!(tag, b'3');
    assert_eq!(read_msg(&mut s).map(|m| m.0), Some(b'Z'));
    let r = query(&mut s, "select 42");
    assert!(r.iter().any(|(t, _)| *t == b'D'), "session still works");

    // A bogus message type: Postgres answers 08P01 and ends that session.
    s.write_all(&msg(b'z', b"junk")).expect("bogus");
    assert_eq!(next_error(&mut s).as_deref(), Some("08P01"));
    assert!(closed(&mut s));

    // A negative length and a truncated message: the gateway's own 08P01.
    let mut s = login(&t);
    s.write_all(&[b'Q', 0xff, 0xff, 0xff, 0xf0])
        .expect("negative");
    assert_eq!(next_error(&mut s).as_deref(), Some("08P01"));
    assert!(closed(&mut s));
    let mut s = login(&t);
    s.write_all(&[b'Q', 0, 0, 0, 100, b's']).expect("truncated");
    drop(s);

    // The token and the gateway are fine.
    let mut s = login(&t);
    let r = query(&mut s, "select count(*) from items");
    assert!(r.iter().any(|(t, _)| *t == b'D'));
    by.finish();
}

#[test]
fn a_client_that_never_reads_does_not_grow_gateway_memory() {
    let by = Bystander::start();
    let t = gw().issue_with(serde_json::json!({
        "task": "slow-reader", "ttl_seconds": 600,
        "max_rows": 100000, "max_bytes": 67108864
    }));
    let mut s = login(&t);
    let before = rss_kib();
    // About 100 MB of results per query, eight queries, none of it ever read.
    let q = "select repeat('x', 100000) from generate_series(1, 1000)";
    let mut body = q.as_bytes().to_vec();
    body.push(0);
    for _ in 0..8 {
        s.write_all(&msg(b'Q', &body)).expect("query");
    }
    let mut peak = before;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(100));
        peak = peak.max(rss_kib());
    }
    eprintln!("gateway RSS {before} KiB before, peak {peak} KiB while 800 MB waited");
    assert!(
        peak < before + 64 * 1024,
        "gateway RSS grew from {before} KiB to {peak} KiB"
    );
    // The stuck session still delivers when it finally reads.
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut rows = 0;
    let mut ready = 0;
    while ready < 8 {
        let (tag, _) = read_msg(&mut s).expect("drain");
        match tag {
            b'D' => rows += 1,
            b'Z' => ready += 1,
            _ => {}
        }
    }
    assert!(rows >= 8 * 600, "rows {rows}");
    by.finish();
}

#[test]
fn authentication_failures_are_rate_limited_per_token_without_refusing_the_secret() {
    let by = Bystander::start();
    let t = gw().issue("rate-limited", 600);
    let other = gw().issue("rate-other", 600);
    let d = dsn(&t);
    let wrong = d.replacen(
        d.split(':')
            .nth(2)
            .and_then(|s| s.split('@').next())
            .expect("secret"),
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        1,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let from = |ip: [u8; 4], dsn: String| async move {
        let sock = tokio::net::TcpSocket::new_v4().expect("socket");
        sock.bind(SocketAddr::from((ip, 0))).expect("bind source");
        let stream = sock.connect(addr()).await.expect("connect");
        let cfg: tokio_postgres::Config = dsn.parse().expect("dsn");
        harness::select_1_on(cfg.connect_raw(stream, tokio_postgres::NoTls).await).await
    };
    rt.block_on(async {
        let attacker = [127, 0, 0, 2];
        for i in 0..5 {
            assert_eq!(
                from(attacker, wrong.clone()).await,
                Err("28P01".into()),
                "guess {i}"
            );
        }
        // Over the limit, failures are answered late with 28000; a correct secret still
        // passes, from that address and any other, and the address is limited for no token.
        assert_eq!(from(attacker, wrong.clone()).await, Err("28000".into()));
        assert_eq!(from(attacker, d.clone()).await, Ok(()));
        assert_eq!(from([127, 0, 0, 3], d.clone()).await, Ok(()));
        assert_eq!(from(attacker, dsn(&other)).await, Ok(()));
        assert_eq!(from(attacker, wrong.clone()).await, Err("28000".into()));
    });
    let g = gw();
    let url = format!("{}/metrics", g.api);
    let m = harness::http_ok("GET", &url, Some(&g.admin_key), harness::Body::None)
        .expect("metrics")
        .body;
    let line = m
        .lines()
        .find(|l| l.starts_with("sandpit_auth_rate_limited_total"))
        .unwrap_or_else(|| panic!("no rate limit metric in\n{m}"));
    let n: f64 = line
        .split_whitespace()
        .last()
        .and_then(|v| v.parse().ok())
        .expect("value");
    assert!(n >= 2.0, "{line}");
    by.finish();
}
