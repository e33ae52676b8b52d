//! Protocol completeness through the gateway, on hand-built wire messages where no client
//! exposes the detail: NegotiateProtocolVersion, Flush, Close, FunctionCall, DISCARD ALL,
//! a LATIN1 session, startup `options` passed through, identity settings refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

use super::{target, Target};

/// A blocking, plain-TCP protocol-3 client that speaks only what these tests need.
struct Raw {
    s: TcpStream,
}

type Msg = (u8, Vec<u8>);

impl Raw {
    fn open(t: &Target) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", t.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Raw { s }
    }

    fn startup(&mut self, minor: u16, params: &[(&str, &[u8])]) {
        let mut body = Vec::new();
        body.extend_from_slice(&(3u32 << 16 | minor as u32).to_be_bytes());
        for (k, v) in params {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v);
            body.push(0);
        }
        body.push(0);
        let mut pkt = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        pkt.extend_from_slice(&body);
        self.s.write_all(&pkt).expect("send startup");
    }

    fn send(&mut self, tag: u8, body: &[u8]) {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        self.s.write_all(&m).expect("send");
    }

    fn recv(&mut self) -> Msg {
        let mut head = [0u8; 5];
        self.s.read_exact(&mut head).expect("read message header");
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        assert!((4..=1 << 24).contains(&len), "message length {len}");
        let mut body = vec![0u8; len - 4];
        self.s.read_exact(&mut body).expect("read message body");
        (head[0], body)
    }

    /// Read messages up to and including the first one tagged `tag`.
    fn until(&mut self, tag: u8) -> Vec<Msg> {
        let mut out = Vec::new();
        loop {
            let m = self.recv();
            let done = m.0 == tag;
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// SCRAM-SHA-256 as the token's id; returns once ReadyForQuery arrived.
    fn login(&mut self, t: &Target) {
        let (tag, body) = self.recv();
        assert_eq!(tag, b'R', "{}", error_text(&body));
        assert_eq!(&body[..4], &10i32.to_be_bytes(), "SASL expected");
        let mut scram = ScramSha256::new(t.secret.as_bytes(), ChannelBinding::unsupported());
        let mut first = b"SCRAM-SHA-256\0".to_vec();
        first.extend_from_slice(&(scram.message().len() as i32).to_be_bytes());
        first.extend_from_slice(scram.message());
        self.send(b'p', &first);
        let (_, cont) = self.recv();
        scram.update(&cont[4..]).expect("server-first");
        self.send(b'p', scram.message());
        let (_, fin) = self.recv();
        scram.finish(&fin[4..]).expect("server-final");
        let (tag, body) = self.recv();
        assert_eq!(
            (tag, &body[..]),
            (b'R', &0i32.to_be_bytes()[..]),
            "AuthenticationOk"
        );
        // After AuthenticationOk the gateway claims the scratch database; a refusal there is
        // an ErrorResponse and a close, whose cause only the gateway's log holds.
        loop {
            let (tag, body) = self.recv();
            assert_ne!(
                tag,
                b'E',
                "login refused: {}\n--- gateway:\n{}",
                error_text(&body),
                super::gateway().log_problems()
            );
            if tag == b'Z' {
                return;
            }
        }
    }

    fn query(&mut self, sql: &[u8]) -> Vec<Msg> {
        let mut b = sql.to_vec();
        b.push(0);
        self.send(b'Q', &b);
        self.until(b'Z')
    }
}

fn cstr(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    v.push(0);
    v
}

/// Fields of the first DataRow among `msgs` (text format).
fn first_row(msgs: &[Msg]) -> Vec<Vec<u8>> {
    let (_, b) = msgs.iter().find(|(t, _)| *t == b'D').expect("a DataRow");
    let n = u16::from_be_bytes([b[0], b[1]]) as usize;
    let mut at = 2;
    let mut out = Vec::new();
    for _ in 0..n {
        let len = i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        at += 4;
        if len < 0 {
            out.push(Vec::new());
        } else {
            out.push(b[at..at + len as usize].to_vec());
            at += len as usize;
        }
    }
    out
}

/// The SQLSTATE and message of an ErrorResponse body.
fn error_text(body: &[u8]) -> String {
    let mut code = String::new();
    let mut msg = String::new();
    for f in body.split(|&b| b == 0) {
        match f.first() {
            Some(b'C') => code = String::from_utf8_lossy(&f[1..]).into(),
            Some(b'M') => msg = String::from_utf8_lossy(&f[1..]).into(),
            _ => {}
        }
    }
    format!("{code} {msg}")
}

fn tags(msgs: &[Msg]) -> String {
    msgs.iter().map(|(t, _)| *t as char).collect()
}

#[test]
fn negotiate_protocol_version_answers_3_0_and_names_unknown_options() {
    let t = target("protocol-negotiate");
    let mut c = Raw::open(&t);
    c.startup(
        2,
        &[
            ("user", t.id.as_bytes()),
            ("database", b"sandpit"),
            ("_pq_.sandpit_test", b"1"),
        ],
    );
    let (tag, body) = c.recv();
    assert_eq!(tag, b'v', "NegotiateProtocolVersion first");
    // Newest version we speak as a whole version number (3.0 = 196608), as PostgreSQL sends.
    assert_eq!(&body[..4], &196608i32.to_be_bytes());
    assert_eq!(&body[4..8], &1i32.to_be_bytes());
    assert_eq!(&body[8..], b"_pq_.sandpit_test\0");
    c.login(&t);
    let r = c.query(b"select 1");
    assert_eq!(first_row(&r), vec![b"1".to_vec()]);
}

#[test]
fn libpq_18_asking_for_protocol_3_2_gets_3_0() {
    // psycopg's binary wheel carries libpq 18, which can ask for 3.2 and checks our answer.
    let t = target("protocol-libpq18");
    let python = std::env::var("SANDPIT_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = r#"
import psycopg, sys
assert psycopg.pq.version() >= 180000, psycopg.pq.version()
for extra in ('max_protocol_version=3.2', 'max_protocol_version=latest&sslmode=disable'):
    with psycopg.connect(sys.argv[1] + '?' + extra) as c:
        assert c.execute('select 41 + 1').fetchone()[0] == 42
"#;
    let out = std::process::Command::new(python)
        .args(["-c", script, &t.dsn])
        .output()
        .expect("run python3 (psycopg is installed by .ci/run)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn flush_close_function_call_and_discard_all_are_relayed() {
    let t = target("protocol-extended");
    let mut c = Raw::open(&t);
    c.startup(0, &[("user", t.id.as_bytes()), ("database", b"sandpit")]);
    c.login(&t);

    // Parse/Bind/Execute then Flush, no Sync: the results must arrive on Flush alone.
    let mut parse = cstr(b"s1");
    parse.extend_from_slice(&cstr(b"select $1::int + 1"));
    parse.extend_from_slice(&0i16.to_be_bytes());
    c.send(b'P', &parse);
    let mut bind = cstr(b"");
    bind.extend_from_slice(&cstr(b"s1"));
    bind.extend_from_slice(&0i16.to_be_bytes());
    bind.extend_from_slice(&1i16.to_be_bytes());
    bind.extend_from_slice(&2i32.to_be_bytes());
    bind.extend_from_slice(b"41");
    bind.extend_from_slice(&0i16.to_be_bytes());
    c.send(b'B', &bind);
    let mut exec = cstr(b"");
    exec.extend_from_slice(&0i32.to_be_bytes());
    c.send(b'E', &exec);
    c.send(b'H', &[]);
    let r = c.until(b'C');
    assert_eq!(
        tags(&r),
        "12DC",
        "ParseComplete, BindComplete, DataRow, CommandComplete"
    );
    assert_eq!(first_row(&r), vec![b"42".to_vec()]);

    // Close the statement; then it is gone.
    let mut close = vec![b'S'];
    close.extend_from_slice(&cstr(b"s1"));
    c.send(b'C', &close);
    c.send(b'S', &[]);
    let r = c.until(b'Z');
    assert_eq!(tags(&r), "3Z", "CloseComplete, ReadyForQuery");
    c.send(b'B', &bind);
    c.send(b'S', &[]);
    let r = c.until(b'Z');
    assert_eq!(r[0].0, b'E');
    assert!(
        error_text(&r[0].1).starts_with("26000"),
        "{}",
        error_text(&r[0].1)
    );

    // FunctionCall ('F'), the path libpq's large-object calls take: abs(int4)(-5) in binary.
    let oid = c.query(b"select 'abs(int4)'::regprocedure::oid");
    let oid: u32 = String::from_utf8_lossy(&first_row(&oid)[0])
        .parse()
        .expect("oid");
    let mut f = oid.to_be_bytes().to_vec();
    f.extend_from_slice(&1i16.to_be_bytes());
    f.extend_from_slice(&1i16.to_be_bytes()); // argument in binary
    f.extend_from_slice(&1i16.to_be_bytes());
    f.extend_from_slice(&4i32.to_be_bytes());
    f.extend_from_slice(&(-5i32).to_be_bytes());
    f.extend_from_slice(&1i16.to_be_bytes()); // result in binary
    c.send(b'F', &f);
    let r = c.until(b'Z');
    assert_eq!(tags(&r), "VZ", "FunctionCallResponse, ReadyForQuery");
    assert_eq!(&r[0].1, &[0, 0, 0, 4, 0, 0, 0, 5], "abs(-5) = 5");

    // DISCARD ALL drops prepared statements.
    let mut parse2 = cstr(b"s2");
    parse2.extend_from_slice(&cstr(b"select 2"));
    parse2.extend_from_slice(&0i16.to_be_bytes());
    c.send(b'P', &parse2);
    c.send(b'S', &[]);
    assert_eq!(tags(&c.until(b'Z')), "1Z");
    let r = c.query(b"discard all");
    let (_, complete) = r.iter().find(|(t, _)| *t == b'C').expect("CommandComplete");
    assert_eq!(complete, b"DISCARD ALL\0");
    let r = c.query(b"select count(*) from pg_prepared_statements");
    assert_eq!(first_row(&r), vec![b"0".to_vec()]);
}

/// pgx binds up to 65,535 parameters: the protocol's counts are unsigned. After a simple
/// Query (whose unnamed portal the gateway must not think is still there), a Bind of 40,000
/// parameters to the unnamed portal runs as on a server (pgx's own
/// TestConnLargeResponseWhileWritingDoesNotDeadlock).
#[test]
fn a_bind_of_more_than_32767_parameters_is_relayed_and_executed() {
    let t = target("protocol-many-params");
    let mut c = Raw::open(&t);
    c.startup(0, &[("user", t.id.as_bytes()), ("database", b"sandpit")]);
    c.login(&t);
    assert_eq!(tags(&c.query(b"select 1")), "TDCZ");
    let n: u16 = 40_000;
    let mut parse = cstr(b"");
    parse.extend_from_slice(&cstr(b"select $1::text || $40000::text"));
    parse.extend_from_slice(&n.to_be_bytes());
    for _ in 0..n {
        parse.extend_from_slice(&25u32.to_be_bytes()); // text
    }
    c.send(b'P', &parse);
    let mut bind = cstr(b"");
    bind.extend_from_slice(&cstr(b""));
    bind.extend_from_slice(&0u16.to_be_bytes());
    bind.extend_from_slice(&n.to_be_bytes());
    for i in 0..n {
        let v: &[u8] = if i == 0 { b"a" } else { b"z" };
        bind.extend_from_slice(&(v.len() as i32).to_be_bytes());
        bind.extend_from_slice(v);
    }
    bind.extend_from_slice(&0u16.to_be_bytes());
    c.send(b'B', &bind);
    c.send(b'D', b"P\0");
    let mut exec = cstr(b"");
    exec.extend_from_slice(&0i32.to_be_bytes());
    c.send(b'E', &exec);
    c.send(b'S', &[]);
    let r = c.until(b'Z');
    assert_eq!(
        tags(&r),
        "12TDCZ",
        "{:?}",
        r.iter()
            .filter(|m| m.0 == b'E')
            .map(|m| error_text(&m.1))
            .collect::<Vec<_>>()
    );
    assert_eq!(first_row(&r), vec![b"az".to_vec()]);
}

#[test]
fn latin1_session_bytes_are_relayed_untouched() {
    let t = target("protocol-latin1");
    let mut c = Raw::open(&t);
    // A LATIN1 application_name is not UTF-8: the gateway must pass it, not refuse it.
    c.startup(
        0,
        &[
            ("user", t.id.as_bytes()),
            ("database", b"sandpit"),
            ("client_encoding", b"LATIN1"),
            ("application_name", b"caf\xe9"),
        ],
    );
    c.login(&t);
    // "déjà" in LATIN1 is 4 bytes; the server (UTF8) stores 6.
    let r = c.query(b"select '\x64\xe9\x6a\xe0'::text, octet_length(convert_to('\x64\xe9\x6a\xe0', 'UTF8')), current_setting('client_encoding'), current_setting('application_name')");
    let row = first_row(&r);
    assert_eq!(row[0], b"\x64\xe9\x6a\xe0".to_vec(), "LATIN1 bytes back");
    assert_eq!(row[1], b"6".to_vec());
    assert_eq!(row[2], b"LATIN1".to_vec());
    // PostgreSQL 15 replaces non-ASCII in application_name with '?', 16+ with \x escapes.
    assert!(
        row[3] == b"caf?".to_vec() || row[3] == b"caf\\xe9".to_vec(),
        "{:?}",
        String::from_utf8_lossy(&row[3])
    );
}

#[test]
fn startup_options_pass_through() {
    let t = target("protocol-options");
    let mut c = Raw::open(&t);
    c.startup(
        0,
        &[
            ("user", t.id.as_bytes()),
            ("database", b"sandpit"),
            ("application_name", b"sandpit-app"),
            ("options", b"-c statement_timeout=1234 --search-path=public"),
        ],
    );
    c.login(&t);
    let r = c.query(b"select current_setting('statement_timeout'), current_setting('application_name'), current_setting('search_path')");
    assert_eq!(
        first_row(&r),
        vec![
            b"1234ms".to_vec(),
            b"sandpit-app".to_vec(),
            b"public".to_vec()
        ]
    );
    // A timeout sent as a startup parameter of its own (node-postgres' `statement_timeout`)
    // is the session's, and the server enforces it; so is one in `options` in its dashed
    // spelling (the token's would otherwise follow it and win).
    for (k, v, setting, want) in [
        (
            "statement_timeout",
            &b"300"[..],
            "statement_timeout",
            &b"300ms"[..],
        ),
        (
            "options",
            &b"--idle-in-transaction-session-timeout=4321"[..],
            "idle_in_transaction_session_timeout",
            &b"4321ms"[..],
        ),
    ] {
        let mut c = Raw::open(&t);
        c.startup(
            0,
            &[("user", t.id.as_bytes()), ("database", b"sandpit"), (k, v)],
        );
        c.login(&t);
        let q = format!("select current_setting('{setting}')");
        assert_eq!(
            first_row(&c.query(q.as_bytes())),
            vec![want.to_vec()],
            "{k}"
        );
    }
    let mut c = Raw::open(&t);
    c.startup(
        0,
        &[
            ("user", t.id.as_bytes()),
            ("database", b"sandpit"),
            ("statement_timeout", b"50"),
        ],
    );
    c.login(&t);
    let r = c.query(b"select pg_sleep(2)");
    assert!(
        r.iter()
            .any(|m| m.0 == b'E' && error_text(&m.1).starts_with("57014")),
        "the client's own statement_timeout cancels: {}",
        tags(&r)
    );
}

/// tokio-postgres' own suite reads `pg_database` without ORDER BY and expects `postgres`
/// first, as on a stock cluster: the golden's set-up leaves the rows in that order.
#[test]
fn pg_database_reads_in_a_stock_clusters_order() {
    let t = target("protocol-catalog-order");
    let mut c = Raw::open(&t);
    c.startup(0, &[("user", t.id.as_bytes()), ("database", b"sandpit")]);
    c.login(&t);
    let r = c.query(b"select datname from pg_database");
    assert_eq!(first_row(&r), vec![b"postgres".to_vec()]);
}

#[test]
fn identity_settings_are_refused_before_auth() {
    let t = target("protocol-refused");
    let refused: Vec<(&str, &[u8])> = vec![
        ("options", b"-c role=sandpit_admin"),
        ("options", b"-crole=sandpit_admin"),
        ("options", b"--role=sandpit_admin"),
        ("options", b"-c session_authorization=sandpit_admin"),
        ("options", b"--session-authorization=sandpit_admin"),
        ("options", b"-c statement_timeout=0 -c ROLE=sandpit_admin"),
        ("role", b"sandpit_admin"),
        ("session_authorization", b"sandpit_admin"),
    ];
    for (k, v) in refused {
        let mut c = Raw::open(&t);
        c.startup(
            0,
            &[("user", t.id.as_bytes()), ("database", b"sandpit"), (k, v)],
        );
        let (tag, body) = c.recv();
        assert_eq!(
            tag,
            b'E',
            "{k}={}: expected a refusal",
            String::from_utf8_lossy(v)
        );
        assert!(
            error_text(&body).starts_with("42501"),
            "{k}: {}",
            error_text(&body)
        );
    }
    // The same through libpq's PGOPTIONS.
    let out = std::process::Command::new("psql")
        .args([t.dsn.as_str(), "-XAtc", "select current_user"])
        .env("PGOPTIONS", "-c role=sandpit_admin")
        .output()
        .expect("psql");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not allowed through sandpit"), "{err}");
}
