//! End-to-end tests of the spine: the real `sandpit` binary, real Postgres processes,
//! real clients (psql, tokio-postgres).

use crate::support::harness;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::support::harness::{
    connect, pid_alive, psql, shared, sqlstate, wait_until, Gateway, SMALL_GOLDEN,
};
use serde_json::Value;

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

fn postmaster_pid(g: &Gateway, token: &str) -> i32 {
    let p = g
        .instances_dir()
        .join(token)
        .join("data")
        .join("postmaster.pid");
    std::fs::read_to_string(&p)
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
        .unwrap_or(0)
}

fn socket_dir(g: &Gateway, token: &str) -> String {
    let p = g
        .instances_dir()
        .join(token)
        .join("data")
        .join("postmaster.pid");
    std::fs::read_to_string(&p)
        .ok()
        .and_then(|s| s.lines().nth(4).map(str::to_string))
        .unwrap_or_default()
}

#[test]
fn cli_issued_dsn_works_with_psql_and_tasks_are_isolated() {
    let g = shared();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandpit"))
        .args([
            "token",
            "issue",
            "--task",
            "reconcile-refunds",
            "--ttl",
            "15m",
            "--api",
            &g.api,
        ])
        .env("SANDPIT_ADMIN_KEY", &g.admin_key)
        .output()
        .expect("run sandpit token issue");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dsn1 = String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_string();
    assert!(dsn1.starts_with("postgresql://sp_"), "{dsn1}");

    let (ok, golden_count, err) = psql(&dsn1, &["-c", "select count(*) from orders"]);
    assert!(ok, "{err}");
    let golden_count: i64 = golden_count.trim().parse().expect("count");
    assert!(golden_count >= 100_000, "{golden_count}");

    let (ok, outp, err) = psql(
        &dsn1,
        &[
            "-c",
            "create table notes(id serial primary key, body text)",
            "-c",
            "insert into notes(body) values ('a'), ('b')",
            "-c",
            "begin; update notes set body = 'c' where id = 1; commit;",
            "-c",
            "begin; delete from notes; rollback;",
            "-c",
            "select string_agg(body, ',' order by id) from notes",
            "-c",
            "DELETE FROM orders WHERE status = 'pending' OR TRUE",
            "-c",
            "select count(*) from orders",
        ],
    );
    assert!(ok, "{err}");
    let lines: Vec<&str> = outp.lines().collect();
    assert!(lines.contains(&"c,b"), "{outp}");
    assert_eq!(lines.last().copied(), Some("0"), "{outp}");

    // A second task, through tokio-postgres, sees the untouched golden.
    let t2 = g.issue("second-task", 600);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn(&t2)).await.expect("connect t2");
        let n: i64 = c
            .query_one("select count(*) from orders", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(n, golden_count);
        let r = c.query("select 1 from notes", &[]).await;
        assert_eq!(
            sqlstate(&r.expect_err("notes must not exist in task 2")),
            "42P01"
        );
        // DDL + DML + a transaction through the extended protocol.
        c.batch_execute("create table t(x int); insert into t values (1),(2)")
            .await
            .expect("ddl");
        let tx_sum: i64 = c
            .query_one("select sum(x)::int8 from t where x > $1", &[&0i32])
            .await
            .expect("q")
            .get(0);
        assert_eq!(tx_sum, 3);
    });
    // The golden itself: a fresh fork still has every order.
    let t3 = g.issue("third-task", 600);
    let (ok, n, err) = psql(&dsn(&t3), &["-c", "select count(*) from orders"]);
    assert!(ok, "{err}");
    assert_eq!(n.trim().parse::<i64>().expect("n"), golden_count);
}

#[test]
fn twenty_concurrent_first_connections_share_one_fork() {
    let g = shared();
    let t = g.issue_with(
        serde_json::json!({"task": "stampede", "ttl_seconds": 600, "max_connections": 25}),
    );
    let d = dsn(&t);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let starts: Vec<String> = rt.block_on(async {
        let mut handles = Vec::new();
        for _ in 0..20 {
            let d = d.clone();
            handles.push(tokio::spawn(async move {
                let c = connect(&d).await.expect("connect");
                let row = c
                    .query_one("select pg_postmaster_start_time()::text", &[])
                    .await
                    .expect("query");
                row.get::<_, String>(0)
            }));
        }
        let mut v = Vec::new();
        for h in handles {
            v.push(h.await.expect("join"));
        }
        v
    });
    assert!(starts.iter().all(|s| s == &starts[0]), "{starts:?}");
    let shown = g.show(&id(&t));
    assert_eq!(shown["fork_count"], 1, "{shown}");
    assert!(g.instances_dir().join(id(&t)).is_dir());
}

#[test]
fn refusals_carry_the_contract_sqlstates_and_others_keep_working() {
    let g = shared();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let good = g.issue("bystander", 600);
        let bystander = connect(&dsn(&good)).await.expect("bystander connects");
        bystander.simple_query("select 1").await.expect("works");

        let t = g.issue("victim", 600);
        let id = id(&t);
        let port = g.pg_port;
        let wrong = format!(
            "postgresql://{id}:{}@127.0.0.1:{port}/sandpit",
            "A".repeat(43)
        );
        let e = connect(&wrong).await.expect_err("wrong secret refused");
        assert_eq!(sqlstate(&e), "28P01", "{e}");

        let unknown = format!(
            "postgresql://sp_aaaaaaaaaaaaaaaaaaaa:{}@127.0.0.1:{port}/sandpit",
            "A".repeat(43)
        );
        let e = connect(&unknown).await.expect_err("unknown refused");
        assert_eq!(sqlstate(&e), "28000");
        assert!(format!("{e:?}").contains("unknown"), "{e}");

        let (status, _) = g.revoke(&id);
        assert_eq!(status, 200);
        let e = connect(&dsn(&t)).await.expect_err("revoked refused");
        assert_eq!(sqlstate(&e), "28000");
        assert!(format!("{e:?}").contains("revoked"), "{e}");

        let short = g.issue("short-lived", 1);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let e = connect(&dsn(&short)).await.expect_err("expired refused");
        assert_eq!(sqlstate(&e), "28000");
        assert!(format!("{e:?}").contains("expired"), "{e}");
        assert_eq!(g.show(&super_id(&short))["state"], "expired");

        // Garbage on the wire costs only its own connection.
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("tcp");
        s.write_all(b"\x00\x00\x00\x08garbage!garbage")
            .expect("write");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);

        bystander
            .simple_query("select 1")
            .await
            .expect("bystander still works");
        let again = connect(&dsn(&good)).await.expect("new sessions still work");
        again.simple_query("select 2").await.expect("works");
    });
}

fn super_id(v: &Value) -> String {
    id(v)
}

#[test]
fn bytes_after_ssl_request_close_the_connection() {
    let g = shared();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", g.pg_port)).expect("tcp");
    let mut pkt = vec![0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    pkt.extend_from_slice(b"\x00\x00\x00\x08\x04\xd2\x16\x2fQ\x00\x00\x00\x0dselect 1\x00");
    s.write_all(&pkt).expect("write");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(
        !buf.starts_with(b"S"),
        "gateway answered S despite early bytes: {buf:?}"
    );
}

#[test]
fn expiry_ends_a_session_mid_query_and_removes_the_backend() {
    let g = shared();
    let t = g.issue("expiring", 8);
    let id = id(&t);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        let pid = postmaster_pid(g, &id);
        assert!(pid > 0 && pid_alive(pid));
        let started = Instant::now();
        let e = c
            .simple_query("select pg_sleep(30)")
            .await
            .expect_err("ended by expiry");
        // 57P01 (not a finished pg_sleep(30)) shows the expiry interrupted it.
        println!("ended by expiry after {:?}", started.elapsed());
        assert_eq!(sqlstate(&e), "57P01", "{e}");
        assert!(format!("{e:?}").contains("expired"), "{e}");
        let ended = Instant::now();
        let gone = wait_until(Duration::from_secs(30), || {
            !pid_alive(pid) && !g.instances_dir().join(&id).exists()
        });
        assert!(
            gone,
            "backend still there {:?} after expiry",
            ended.elapsed()
        );
        // Its bytes are freed in the background, soon after.
        let trash = g.data_dir.join("pg").join("trash");
        let freed = wait_until(Duration::from_secs(60), || {
            std::fs::read_dir(&trash)
                .map(|mut d| {
                    !d.any(|e| {
                        e.map(|e| e.file_name().to_string_lossy().starts_with(id.as_str()))
                            .unwrap_or(false)
                    })
                })
                .unwrap_or(true)
        });
        assert!(freed, "destroyed instance still in {}", trash.display());
    });
}

#[test]
fn cancel_with_the_gateway_key_reaches_only_its_session() {
    let g = shared();
    let t = g.issue("cancelling", 600);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let a = connect(&dsn(&t)).await.expect("a");
        let b = connect(&dsn(&t)).await.expect("b");
        let cancel_a = a.cancel_token();
        let qa =
            tokio::spawn(async move { a.simple_query("select pg_sleep(3)").await.map(|_| ()) });
        let qb =
            tokio::spawn(async move { b.simple_query("select pg_sleep(3)").await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t0 = Instant::now();
        cancel_a
            .cancel_query(tokio_postgres::NoTls)
            .await
            .expect("cancel sent");
        let ra = qa.await.expect("join a");
        println!("cancelled after {:?}", t0.elapsed());
        assert_eq!(sqlstate(&ra.expect_err("a was cancelled")), "57014");
        qb.await.expect("join b").expect("b was not cancelled");
    });
}

#[test]
fn scratch_server_cannot_run_programs_or_reach_the_network() {
    let g = shared();
    let t = g.issue("containment", 600);
    let id = id(&t);
    let (ok, _, err) = psql(&dsn(&t), &["-c", "COPY (select 1) TO PROGRAM 'true'"]);
    assert!(!ok);
    assert!(
        err.contains("permission denied")
            || err.contains("42501")
            || err.contains("must be superuser"),
        "{err}"
    );

    let pid = postmaster_pid(g, &id);
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("ns");
    let ours = std::fs::read_link("/proc/self/ns/net").expect("ns");
    if !harness::require(
        theirs != ours,
        "a network namespace",
        "needs root (CAP_SYS_ADMIN)",
    ) {
        return;
    }
    // As the instance's superuser (only the gateway's OS user can be), try to open a TCP
    // connection from inside the scratch server to the gateway's own port.
    let sock = socket_dir(g, &id);
    let cmd = format!(
        "COPY (select 1) TO PROGRAM 'bash -c \"exec 3<>/dev/tcp/127.0.0.1/{}\"'",
        g.pg_port
    );
    let out = std::process::Command::new("psql")
        .args([
            "-X",
            "-h",
            &sock,
            "-U",
            "sandpit_admin",
            "-d",
            "sandpit",
            "-c",
            &cmd,
        ])
        .output()
        .expect("psql");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "TCP connect from the scratch server succeeded"
    );
    assert!(err.contains("program") || err.contains("failed"), "{err}");
    // Control: the same port is reachable from outside the namespace.
    std::net::TcpStream::connect(("127.0.0.1", g.pg_port))
        .expect("gateway reachable from the host");
}

#[test]
fn client_messages_never_show_socket_paths_or_the_superuser() {
    let g = shared();
    let t = g.issue("scrub", 600);
    let id = id(&t);
    let script = "\\set VERBOSITY verbose\n\
        select * from no_such_table;\n\
        set role sandpit_admin;\n\
        set session authorization sandpit_admin;\n\
        copy (select 1) to program 'true';\n\
        select pg_read_file('postmaster.pid');\n\
        show unix_socket_directories;\n\
        show data_directory;\n\
        select current_setting('config_file');\n\
        create extension adminpack;\n\
        alter system set fsync = on;\n\
        select 1;\n";
    let out = std::process::Command::new("psql")
        .arg(dsn(&t))
        .args(["-X", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin
                .take()
                .expect("stdin")
                .write_all(script.as_bytes())?;
            c.wait_with_output()
        })
        .expect("psql");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sock = socket_dir(g, &id);
    assert!(!sock.is_empty());
    assert!(all.contains("no_such_table"), "{all}");
    for secret in [
        sock.as_str(),
        "sandpit_admin",
        g.data_dir.to_str().expect("path"),
        ".s.PGSQL",
    ] {
        assert!(!all.contains(secret), "client saw {secret:?}:\n{all}");
    }
    // Errors keep their SQLSTATE.
    assert!(all.contains("42P01"), "{all}");
}

#[test]
fn tls_and_cleartext_rules() {
    let cfg = "[limits]\ncleartext_on_loopback = false\n";
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(cfg));
    let t = g.issue("tls", 600);
    let id = id(&t);
    let secret = dsn(&t)
        .split(':')
        .nth(2)
        .and_then(|s| s.split('@').next())
        .expect("secret")
        .to_string();
    let port = g.pg_port;
    // SCRAM over TLS.
    let (ok, out, err) = psql(
        &format!("{}?sslmode=require", dsn(&t)),
        &["-c", "select count(*) from items"],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1000");
    // Cleartext (the whole token as the password) over TLS works.
    let clear = format!("postgresql://agent:{id}.{secret}@127.0.0.1:{port}/sandpit");
    let (ok, out, err) = psql(&format!("{clear}?sslmode=require"), &["-c", "select 1"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1");
    // A password that is no token fails as a wrong password does on a server (28P01).
    let (ok, _, err) = psql(
        &format!("postgresql://agent:nope@127.0.0.1:{port}/sandpit?sslmode=require"),
        &["-c", "select 1"],
    );
    assert!(!ok);
    assert!(
        err.contains("password authentication failed for user \"agent\""),
        "{err}"
    );
    // Without TLS, from a client the gateway does not trust for cleartext: refused before the password.
    let (ok, _, err) = psql(&format!("{clear}?sslmode=disable"), &["-c", "select 1"]);
    assert!(!ok);
    assert!(err.contains("requires TLS"), "{err}");
    // SCRAM without TLS is fine.
    let (ok, _, err) = psql(&format!("{}?sslmode=disable", dsn(&t)), &["-c", "select 1"]);
    assert!(ok, "{err}");
}

/// A TLS client that trusts the gateway's generated certificate and offers `alpn`.
fn direct_tls_client(g: &Gateway, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let pem = std::fs::read(g.data_dir.join("tls/cert.pem")).expect("cert.pem");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut &pem[..]) {
        roots.add(c.expect("cert")).expect("root");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
}

/// PostgreSQL 17's direct TLS (`sslnegotiation=direct`): the ClientHello is the connection's
/// first bytes, with ALPN `postgresql`; a session then runs as over an SSLRequest. Without
/// ALPN the gateway refuses (as PostgreSQL does); a client offering another protocol fails
/// the handshake.
#[test]
fn direct_tls_sessions_as_postgresql_17_clients_open_them() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let t = g.issue("direct-tls", 600);
    let mut cfg: tokio_postgres::Config = dsn(&t).parse().expect("dsn");
    cfg.ssl_mode(tokio_postgres::config::SslMode::Disable); // the TLS is ours, below it
    let port = g.pg_port;
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let open = |alpn: &'static [&'static [u8]]| {
            let connector = direct_tls_client(&g, alpn);
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .expect("tcp");
                let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
                connector.connect(name, tcp).await
            }
        };
        let tls = open(&[b"postgresql"]).await.expect("handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"postgresql"[..]));
        let (c, conn) = cfg
            .connect_raw(tls, tokio_postgres::NoTls)
            .await
            .expect("login");
        tokio::spawn(conn);
        let n: i64 = c
            .query_one("select count(*) from items", &[])
            .await
            .expect("query")
            .get(0);
        assert_eq!(n, 1000);

        let tls = open(&[]).await.expect("handshake without ALPN");
        let e = cfg
            .connect_raw(tls, tokio_postgres::NoTls)
            .await
            .err()
            .expect("refused without ALPN");
        let msg = e.as_db_error().map(|d| d.message().to_string());
        assert!(msg.as_deref().is_some_and(|m| m.contains("ALPN")), "{e:?}");

        assert!(open(&[b"h2"]).await.is_err(), "another protocol is refused");
    });
    // A plain session still works beside them.
    let (ok, out, err) = psql(&dsn(&t), &["-c", "select 1"]);
    assert!(ok && out.trim() == "1", "{err}");

    // With TLS off there is nothing to answer a ClientHello with: the connection is closed.
    let off = Gateway::start(Some(SMALL_GOLDEN), Some("[tls]\nmode = \"off\"\n"));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", off.pg_port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    // A TLS record header (handshake, TLS 1.0) and the start of a ClientHello.
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x40, 0x01, 0x00, 0x00, 0x3c])
        .expect("send");
    let mut buf = [0u8; 64];
    assert!(
        matches!(s.read(&mut buf), Ok(0) | Err(_)),
        "closed without an answer"
    );
    let m = harness::metrics(&off.api);
    let closed = m
        .iter()
        .find(|(k, _)| k.contains("protocol_violations") && k.contains("direct_tls_without_tls"))
        .map(|(_, v)| *v);
    assert_eq!(closed, Some(1.0), "{m:?}");
}

/// A harness whose HTTP client goes away mid-revoke (its timeout, its crash) does not cut the
/// revoke short: the review is stored and the backend destroyed by the request itself, not
/// by a later janitor pass (the janitor is off here).
#[test]
fn a_revoke_runs_to_its_end_when_the_client_goes_away() {
    let g = Gateway::start(Some(SMALL_GOLDEN), Some("[janitor]\ninterval = \"0s\"\n"));
    let t = g.issue("walk-away", 600);
    let id = id(&t);
    // A change whose review takes a while (its new table is hashed for the patch check).
    let (ok, _, err) = psql(
        &dsn(&t),
        &[
            "-c",
            "create table big as select g, md5(g::text) m from generate_series(1, 1000000) g",
        ],
    );
    assert!(ok, "{err}");
    let addr = g.api.trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&addr).expect("api");
    write!(
        s,
        "DELETE /v1/tokens/{id} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Length: 0\r\n\r\n",
        g.admin_key
    )
    .expect("send");
    // Once the revoke has begun, the client leaves without reading the answer.
    assert!(wait_until(Duration::from_secs(60), || g.show(&id)["state"]
        == "revoked"));
    drop(s);
    assert!(
        wait_until(Duration::from_secs(300), || {
            let v = g.show(&id);
            v["end"] == "destroyed" && v["backend"] == false
        }),
        "the revoke stopped when its client left: {}",
        g.show(&id)
    );
    let (status, review) = g.raw_call("GET", &format!("/v1/tokens/{id}/review"), None);
    assert_eq!(status, 200, "{review}");
    assert!(!review["capture"].is_null(), "{review}");
}

#[test]
fn restarted_gateway_serves_issued_tokens() {
    let tmp = harness::tempdir();
    let mut g = Gateway::start_in(tmp.path(), Some(SMALL_GOLDEN), None);
    let t = g.issue("survivor", 600);
    let (ok, _, err) = psql(
        &dsn(&t),
        &[
            "-c",
            "create table kept(x int); insert into kept values (42)",
        ],
    );
    assert!(ok, "{err}");
    g.stop();
    let g2 = Gateway::start_in(tmp.path(), Some(SMALL_GOLDEN), None);
    let old_port = format!(":{}/", g.pg_port);
    let d = dsn(&t).replace(&old_port, &format!(":{}/", g2.pg_port));
    let (ok, out, err) = psql(&d, &["-c", "select x from kept"]);
    assert!(ok, "{err}\n{}", g2.log());
    assert_eq!(out.trim(), "42");
    assert_eq!(g2.show(&id(&t))["fork_count"], 1);
}
