//! Row and byte caps, and the write-ahead statement log, through the real gateway with
//! psql, tokio-postgres (extended protocol, pipelined) and psycopg 3.

use crate::support::harness;

use std::time::Duration;

use crate::support::harness::{connect, psql, sqlstate, Gateway};
use serde_json::Value;

const GOLDEN: &str =
    "create table big as select g as id, md5(g::text) as v from generate_series(1, 100000) g;\n\
alter table big add primary key (id);\n\
create table notes(id serial primary key, body text);\n";

fn gateway() -> Gateway {
    Gateway::start(Some(GOLDEN), None)
}

fn dsn(v: &Value) -> String {
    v["dsn"].as_str().expect("dsn").to_string()
}

fn statements(g: &Gateway, id: &str) -> Vec<Value> {
    let (s, v) = g.raw_call("GET", &format!("/v1/tokens/{id}/statements"), None);
    assert_eq!(s, 200, "{v}");
    v.as_array().cloned().unwrap_or_default()
}

#[test]
fn psql_sees_capped_results_and_keeps_going() {
    let g = gateway();
    let t = g.issue("caps-psql", 600);
    let d = dsn(&t);
    let (ok, out, err) = psql(&d, &["-c", "select * from big"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 200, "{err}");
    assert!(err.contains("result cut at 200 rows"), "{err}");

    // Inside a transaction: the cap does not abort it; later statements and COMMIT work.
    let (ok, out, err) = psql(
        &d,
        &[
            "-c",
            "begin; insert into notes(body) values ('before'); select * from big; insert into notes(body) values ('after'); commit;",
            "-c",
            "select string_agg(body, ',' order by id) from notes",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.lines().last(), Some("before,after"), "{out}");

    // Several results in one simple query are each capped on their own.
    let (ok, out, err) = psql(
        &d,
        &[
            "-c",
            "select id from big; select 'x'; select id from big where id <= 5",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 200 + 1 + 5, "{out}");

    // COPY TO STDOUT is cut by bytes (max_bytes 4096 for this token).
    let small = g.issue_with(
        serde_json::json!({"task": "caps-copy", "ttl_seconds": 600, "max_bytes": 4096}),
    );
    let (ok, out, err) = psql(&dsn(&small), &["-c", "copy big to stdout"]);
    assert!(ok, "{err}");
    assert!(out.len() <= 4096 && out.len() > 3000, "{} bytes", out.len());
    assert!(err.contains("max_bytes"), "{err}");
    // The byte cap cuts row results too.
    let (ok, out, err) = psql(&dsn(&small), &["-c", "select v from big"]);
    assert!(ok, "{err}");
    assert!(
        out.lines().count() < 200 && err.contains("max_bytes"),
        "{}\n{err}",
        out.lines().count()
    );

    // A cursor fetched 50 at a time works: every FETCH is its own statement.
    let (ok, out, err) = psql(
        &d,
        &[
            "-c",
            "begin; declare c cursor for select id from big order by id; fetch 50 from c; fetch 50 from c; fetch all from c; commit;",
        ],
    );
    assert!(ok, "{err}");
    // psql also prints the BEGIN / DECLARE CURSOR / COMMIT tags; keep the rows.
    let ids: Vec<&str> = out
        .lines()
        .filter(|l| l.chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(ids.len(), 50 + 50 + 200);
    assert_eq!(ids[0], "1");
    assert_eq!(ids[99], "100");
    assert_eq!(ids[100], "101");
}

#[test]
fn error_mode_fails_the_statement_with_54000_and_keeps_state_true() {
    let g = gateway();
    let t = g.issue_with(
        serde_json::json!({"task": "caps-error", "ttl_seconds": 600, "cap_mode": "error"}),
    );
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        let e = c
            .query("select * from big", &[])
            .await
            .expect_err("over the cap");
        assert_eq!(sqlstate(&e), "54000");
        // Under the cap: fine.
        let rows = c
            .query("select * from big where id <= 200", &[])
            .await
            .expect("fits");
        assert_eq!(rows.len(), 200);
        // In a transaction the failure is real: the transaction is aborted, like any error.
        c.batch_execute("begin").await.expect("begin");
        let e = c
            .simple_query("select * from big")
            .await
            .expect_err("over the cap");
        assert_eq!(sqlstate(&e), "54000");
        let e = c
            .simple_query("select 1")
            .await
            .expect_err("aborted transaction");
        assert_eq!(sqlstate(&e), "25P02");
        c.batch_execute("rollback").await.expect("rollback");
        let n: i64 = c
            .query_one("select count(*) from big", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(n, 100_000);
    });
}

#[test]
fn tokio_postgres_pipelined_extended_queries_are_capped_each() {
    let g = gateway();
    let t = g.issue("caps-tokio", 600);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        let big = c.prepare("select id, v from big order by id").await.expect("prepare");
        let one = c.prepare("select id from big where id = $1").await.expect("prepare");
        // Futures polled together are pipelined on one connection.
        let (a, b, x, y) = tokio::join!(c.query(&big, &[]), c.query(&one, &[&7i32]), c.query(&big, &[]), c.query(&one, &[&9i32]));
        let (a, b, x, y) = (a.expect("a"), b.expect("b"), x.expect("x"), y.expect("y"));
        assert_eq!(a.len(), 200);
        assert_eq!(x.len(), 200);
        assert_eq!(b[0].get::<_, i32>(0), 7);
        assert_eq!(y[0].get::<_, i32>(0), 9);
        let first: i32 = a[0].get(0);
        let last: i32 = a[199].get(0);
        assert_eq!((first, last), (1, 200));
        // A write's RETURNING rows are not cut by the row cap (an ORM needs every key; the
        // byte cap still applies): all 500 come back, decided by the INSERT tag.
        let ret = c.query("insert into notes(body) select 'n' || g from generate_series(1, 500) g returning id", &[]).await.expect("insert");
        assert_eq!(ret.len(), 500);
        // A read the backend runs to its end (it names a catalog, so it is not stopped
        // early) is still cut at the cap when its columns are not catalog columns.
        let rows = c.query("select g, 'pg_' from generate_series(1, 1000) g", &[]).await.expect("read");
        assert_eq!(rows.len(), 200);
        // A driver's catalog query is passed whole.
        let rows = c.query("select oid from pg_catalog.pg_proc", &[]).await.expect("catalog");
        assert!(rows.len() > 1000, "{}", rows.len());
        let n: i64 = c.query_one("select count(*) from notes", &[]).await.expect("count").get(0);
        assert_eq!(n, 500);
        // A real error in a pipeline keeps its SQLSTATE, and the session goes on.
        let e = c.query("select * from no_such_table", &[]).await.expect_err("error");
        assert_eq!(sqlstate(&e), "42P01");
        c.simple_query("select 1").await.expect("still usable");
    });
}

#[test]
fn psycopg_sees_caps_in_every_mode() {
    let g = gateway();
    let t = g.issue("caps-psycopg", 600);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/caps/psycopg_caps.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(dsn(&t))
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("psycopg caps ok"),
        "{stdout}\n{stderr}\n{}",
        g.log()
    );
}

#[test]
fn every_statement_is_logged_with_kind_rows_and_outcome() {
    let g = gateway();
    let t = g.issue("logging", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let (ok, _, err) = psql(
        &dsn(&t),
        &[
            "-c",
            "select * from big",
            "-c",
            "insert into notes(body) values ('a'), ('b')",
            "-c",
            "create table extra(x int)",
            "-c",
            "begin; update notes set body = 'c' where id = 1; commit;",
            "-c",
            "grant select on extra to public",
            "-c",
            "set work_mem = '8MB'",
            "-c",
            "do $$ begin perform 1; end $$",
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, _) = psql(&dsn(&t), &["-c", "select * from no_such_table; select 1"]);
    assert!(!ok);
    let log = statements(&g, &id);
    let find = |text: &str| {
        log.iter()
            .find(|s| s["text"] == text)
            .unwrap_or_else(|| panic!("{text} not logged: {log:#?}"))
            .clone()
    };
    let s = find("select * from big");
    assert_eq!(s["kind"], "read");
    assert_eq!(s["outcome"]["rows"], 200);
    assert_eq!(s["outcome"]["capped"], true);
    let s = find("insert into notes(body) values ('a'), ('b')");
    assert_eq!(
        (s["kind"].as_str(), s["outcome"]["rows"].as_u64()),
        (Some("write"), Some(2))
    );
    assert_eq!(find("create table extra(x int)")["kind"], "ddl");
    assert_eq!(find("begin")["kind"], "transaction");
    assert_eq!(
        find("update notes set body = 'c' where id = 1")["outcome"]["rows"],
        1
    );
    assert_eq!(find("grant select on extra to public")["kind"], "privilege");
    assert_eq!(find("set work_mem = '8MB'")["kind"], "utility");
    assert_eq!(find("do $$ begin perform 1; end $$")["kind"], "unparsed");
    let s = find("select * from no_such_table");
    assert_eq!(s["outcome"]["sqlstate"], "42P01");
    assert_eq!(find("select 1")["outcome"]["skipped"], true);
    for s in &log {
        assert_eq!(s["token"], id.as_str());
        assert_eq!(s["task"], "logging");
        assert!(s["outcome"].is_object(), "statement without outcome: {s}");
    }
    // The CLI prints the same log by task name.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandpit"))
        .args(["log", "logging", "--api", &g.api])
        .env("SANDPIT_ADMIN_KEY", &g.admin_key)
        .output()
        .expect("sandpit log");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("select * from big") && text.contains("CAPPED"),
        "{text}"
    );
}

#[test]
fn an_open_sessions_finished_statement_reads_with_its_outcome() {
    // Outcome records are deferred to the session's next write; the statements API writes
    // them before it reads, so a finished statement is never shown without its outcome.
    let g = gateway();
    let t = g.issue("deferred", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        c.simple_query("select 41 + 1").await.expect("query");
        let log = statements(&g, &id);
        let s = log
            .iter()
            .find(|s| s["text"] == "select 41 + 1")
            .unwrap_or_else(|| panic!("not logged: {log:#?}"));
        assert_eq!(s["outcome"]["tag"], "SELECT 1", "{s}");
        drop(c);
    });
}

#[test]
fn a_statement_sent_just_before_sigkill_is_in_the_log_after_restart() {
    let tmp = harness::tempdir();
    let mut g = Gateway::start_in(tmp.path(), Some(GOLDEN), None);
    let t = g.issue("crash", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        c.simple_query("select 1").await.expect("warm");
        let pending =
            tokio::spawn(async move { c.simple_query("select pg_sleep(5), 'last words'").await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        g.kill();
        let _ = pending.await;
    });
    let g2 = Gateway::start_in(tmp.path(), Some(GOLDEN), None);
    let log = statements(&g2, &id);
    assert!(
        log.iter()
            .any(|s| s["text"] == "select pg_sleep(5), 'last words'"),
        "{log:#?}"
    );
}

/// Every statement of a token's log, page by page.
fn all_statements(g: &Gateway, id: &str) -> Vec<Value> {
    let (mut all, mut after) = (Vec::new(), 0u64);
    loop {
        let (s, v) = g.raw_call(
            "GET",
            &format!("/v1/tokens/{id}/statements?after={after}&limit=10000"),
            None,
        );
        assert_eq!(s, 200, "{v}");
        let page = v.as_array().cloned().unwrap_or_default();
        match page.last().and_then(|s| s["seq"].as_u64()) {
            Some(last) => after = last,
            None => return all,
        }
        all.extend(page);
    }
}

#[test]
fn statements_of_a_busy_session_killed_mid_stream_are_in_the_log_after_restart() {
    // A busy log is copied into a mapping of its file rather than written (one syscall
    // less per statement): what the client was answered for must still be on record.
    let tmp = harness::tempdir();
    // Mapping needs `fallocate`; without it the log stays on write(2) (tested above).
    let probe = std::fs::File::create(tmp.path().join("fallocate-probe")).expect("probe");
    // SAFETY: a plain syscall on a descriptor we own.
    let fallocate = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&probe), 0, 0, 4096) };
    let why = std::io::Error::last_os_error().to_string();
    if !harness::require(
        fallocate == 0,
        "fallocate on the temp dir's filesystem",
        &why,
    ) {
        return;
    }
    let mut g = Gateway::start_in(tmp.path(), Some(GOLDEN), None);
    let t = g.issue("crash-busy", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let path = tmp
        .path()
        .join("logs/crash-busy")
        .join(format!("{id}.jsonl"));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    // A repeated text too: its records refer to one definition (the compact log).
    let repeats = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn(&t)).await.expect("connect");
        let (seen, again) = (answered.clone(), repeats.clone());
        let busy = tokio::spawn(async move {
            for i in 1u64.. {
                if c.simple_query(&format!("select {i}")).await.is_err() {
                    break;
                }
                seen.store(i, std::sync::atomic::Ordering::SeqCst);
                if c.simple_query("select 'again'").await.is_err() {
                    break;
                }
                again.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        // Mapped: the file ends in its reserved, still zero, tail.
        let mapped = harness::wait_until(Duration::from_secs(60), || {
            std::fs::read(&path).is_ok_and(|b| b.last() == Some(&0))
        });
        assert!(mapped, "the busy log was never mapped");
        // Killed mid-stream of a mapped log: some statements answered after the mapping (on a
        // loaded machine the log maps after its first 16 writes, a handful of statements).
        let at_map = answered.load(std::sync::atomic::Ordering::SeqCst);
        let more = harness::wait_until(Duration::from_secs(60), || {
            answered.load(std::sync::atomic::Ordering::SeqCst) > at_map.max(16) + 16
        });
        assert!(
            more,
            "statements stopped being answered after the log was mapped"
        );
        g.kill();
        let _ = busy.await;
    });
    let last = answered.load(std::sync::atomic::Ordering::SeqCst);
    assert!(last > 16, "only {last} statements answered");
    let repeated = repeats.load(std::sync::atomic::Ordering::SeqCst);
    // Only a torn last record may be unreadable.
    assert!(
        sandpit::journal::log::unreadable_lines(&path)
            .expect("check")
            .len()
            <= 1
    );
    let g2 = Gateway::start_in(tmp.path(), Some(GOLDEN), None);
    let all = all_statements(&g2, &id);
    let again = all.iter().filter(|s| s["text"] == "select 'again'").count() as u64;
    assert!(
        again >= repeated,
        "{again} of {repeated} repeated statements logged"
    );
    let logged: std::collections::HashSet<String> = all
        .iter()
        .filter_map(|s| s["text"].as_str().map(str::to_string))
        .collect();
    for i in 1..=last {
        assert!(
            logged.contains(&format!("select {i}")),
            "select {i} of {last} not logged"
        );
    }
    // The token goes on logging after the restart, after what the crash left.
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let moved = dsn(&t).replace(&format!(":{}/", g.pg_port), &format!(":{}/", g2.pg_port));
        let c = connect(&moved).await.expect("reconnect");
        c.simple_query("select 'after restart'")
            .await
            .expect("query");
    });
    assert!(all_statements(&g2, &id)
        .iter()
        .any(|s| s["text"] == "select 'after restart'"));
}

#[test]
fn a_capped_select_does_not_stream_the_whole_result_through_the_gateway() {
    let g = gateway();
    let t = g.issue("caps-stream", 600);
    let metric = |g: &Gateway| -> f64 {
        let body = harness::http_ok(
            "GET",
            &format!("{}/metrics", g.api),
            None,
            harness::Body::None,
        )
        .expect("metrics")
        .body;
        body.lines()
            .find(|l| l.starts_with("sandpit_bytes_total") && l.contains("backend_to_client"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let before = metric(&g);
    // Two million rows of ~40 bytes: ~80 MB if it were streamed.
    let (ok, out, err) = psql(
        &dsn(&t),
        &[
            "-c",
            "select g, md5(g::text) from generate_series(1, 2000000) g",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 200);
    let relayed = metric(&g) - before;
    assert!(
        relayed > 0.0 && relayed < 1_000_000.0,
        "{relayed} bytes relayed for a capped result"
    );
}

#[test]
fn caps_above_the_gateway_ceiling_are_refused_at_issue() {
    let g = gateway();
    let (s, v) = g.raw_call(
        "POST",
        "/v1/tokens",
        Some(serde_json::json!({"task": "greedy", "max_rows": 10_000_000})),
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap_or("").contains("max_rows_limit"),
        "{v}"
    );
    // More sessions than the token's scratch server would admit for its role.
    let (s, v) = g.raw_call(
        "POST",
        "/v1/tokens",
        Some(serde_json::json!({"task": "crowd", "max_connections": 64})),
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .contains("max_connections may be at most"),
        "{v}"
    );
}

/// Notices, notifications and error fields are bytes the client is sent: they count against
/// `max_bytes` however the agent makes the server produce them.
#[test]
fn notices_notifications_and_long_errors_are_capped_by_bytes() {
    let g = gateway();
    let t = g.issue_with(serde_json::json!({
        "task": "caps-noise", "ttl_seconds": 600, "max_rows": 10, "max_bytes": 10_000
    }));
    let d = dsn(&t);

    // 100 000 notices from one DO loop (about 19 MB from the server).
    let (ok, _, err) = psql(
        &d,
        &["-c", "do $$ begin for i in 1..100000 loop raise notice 'n % %', i, repeat('x', 150); end loop; end $$"],
    );
    assert!(ok, "{}", &err[..err.len().min(2000)]);
    let shown = err.lines().filter(|l| l.starts_with("NOTICE:  n ")).count();
    assert!(
        (1..100).contains(&shown),
        "{shown} notices reached the client"
    );
    assert!(
        err.len() < 30_000,
        "{} bytes of notices on stderr",
        err.len()
    );
    assert!(
        err.contains("notifications") && err.contains("were not sent because"),
        "{}",
        &err[err.len().saturating_sub(2000)..]
    );

    // The session goes on with a fresh budget: a later statement's notices are shown.
    let (ok, _, err) = psql(&d, &["-c", "do $$ begin raise notice 'after'; end $$"]);
    assert!(ok && err.contains("NOTICE:  after"), "{err}");

    // pg_notify of 100 000 rows in the session that listens: delivered at commit, capped.
    let (ok, out, err) = psql(
        &d,
        &["-c", "listen flood", "-c", "select count(pg_notify('flood', repeat('y', 100) || g)) from generate_series(1, 100000) g"],
    );
    assert!(ok, "{}", &err[..err.len().min(2000)]);
    let got = out
        .lines()
        .filter(|l| l.contains("Asynchronous notification"))
        .count();
    assert!(got < 100, "{got} notifications reached the client");
    assert!(
        err.contains("were not sent because"),
        "{}",
        &err[..err.len().min(2000)]
    );

    // One error whose DETAIL and HINT carry a megabyte each: cut, with a marker.
    let (ok, _, err) = psql(
        &d,
        &["-c", "do $$ begin raise exception 'boom' using detail = repeat('d', 1000000), hint = repeat('h', 1000000); end $$"],
    );
    assert!(!ok);
    assert!(
        err.contains("boom") && err.contains("more bytes cut]"),
        "{}",
        &err[..err.len().min(2000)]
    );
    assert!(err.len() < 20_000, "{} bytes of error", err.len());

    // A session that only listens while another one floods the channel.
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        use futures_util::StreamExt;
        let (listener, mut conn) = tokio_postgres::connect(&d, tokio_postgres::NoTls).await.expect("connect");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
            while let Some(Ok(m)) = messages.next().await {
                let _ = tx.send(m);
            }
        });
        listener.batch_execute("listen other").await.expect("listen");
        let sender = connect(&d).await.expect("connect");
        sender
            .batch_execute("select count(pg_notify('other', repeat('z', 100) || g)) from generate_series(1, 50000) g")
            .await
            .expect("notify");
        // The listener's next statement ends its stretch: what was dropped is said then.
        listener.batch_execute("select 1").await.expect("still usable");
        let mut notifications = 0;
        let mut summary = false;
        while let Ok(m) = rx.try_recv() {
            match m {
                tokio_postgres::AsyncMessage::Notification(_) => notifications += 1,
                tokio_postgres::AsyncMessage::Notice(n) => summary |= n.message().contains("were not sent"),
                _ => {}
            }
        }
        assert!((1..100).contains(&notifications), "{notifications} notifications reached the listener");
        assert!(summary, "no notice saying what was dropped");
    });
}
