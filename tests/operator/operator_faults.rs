//! Faults an operator meets: a scratch server killed under a running gateway (kill -9 of its
//! postmaster), and a changed golden SQL file (with a typo, or valid while tokens forked from
//! the old golden still live). Real `sandpit` binaries, real Postgres, real clients.

use crate::support::harness;
use crate::support::wire;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::harness::{
    metrics, pid_alive, postmaster, query_one, sqlstate, wait_until, Gateway,
};
use serde_json::Value;
use wire::{field, Raw};

const GOLDEN: &str = "create table items(id int primary key, name text not null);\n\
insert into items select g, 'item ' || g from generate_series(1, 1000) g;\n";

/// Writes acknowledged one commit at a time right before the kill.
const COMMITS: i64 = 40;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn s(v: &Value, k: &str) -> String {
    v[k].as_str()
        .unwrap_or_else(|| panic!("{k} in {v}"))
        .to_string()
}

/// `<id>.<secret>`, the cleartext password of a raw login.
fn full_token(v: &Value) -> String {
    crate::support::wire::full_token(&s(v, "dsn"))
}

/// Runs one simple query on a raw session; panics on an error.
fn exec(r: &mut Raw, sql: &str) {
    r.send(&wire::query(sql));
    for (tag, body) in r.until_ready() {
        assert_ne!(tag, b'E', "{sql}: {}", field(&body, b'M'));
    }
}

fn api_get(g: &Gateway, path: &str) -> (u16, Value) {
    g.raw_call("GET", path, None)
}

fn diff(g: &Gateway, id: &str) -> Value {
    let (code, v) = api_get(g, &format!("/v1/tokens/{id}/diff"));
    assert_eq!(code, 200, "{v}");
    v
}

/// (inserted, updated, deleted) of `table` in a review.
fn changes(review: &Value, table: &str) -> (u64, u64, u64) {
    let t = review["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|t| t["table"].as_str().is_some_and(|n| n.ends_with(table)))
        .unwrap_or_else(|| panic!("no changes of {table} in {review:#}"));
    assert!(t.get("error").is_none(), "{t}");
    let n = |k: &str| t[k].as_u64().unwrap_or(0);
    (n("inserted"), n("updated"), n("deleted"))
}

fn reap(g: &Gateway) -> Value {
    let (code, v) = g.raw_call("POST", "/v1/reap", None);
    assert_eq!(code, 200, "{v}");
    v
}

/// Reads until an ErrorResponse, which must carry a SQLSTATE of a connection that ended.
fn assert_cut_with_an_error(r: &mut Raw) {
    let mut error = None;
    while let Some((tag, body)) = r.read() {
        if tag == b'E' {
            error = Some((field(&body, b'C'), field(&body, b'M')));
            break;
        }
    }
    let (code, message) = error.expect("the cut session got no error");
    eprintln!("cut session: {code} {message}");
    assert_eq!(code.len(), 5, "SQLSTATE of {message:?}: {code:?}");
    assert!(
        code.starts_with("57") || code.starts_with("08"),
        "{code}: {message}"
    );
}

fn kill9(pid: i32) {
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        wait_until(Duration::from_secs(30), || !pid_alive(pid)),
        "postmaster {pid} survived SIGKILL"
    );
}

#[test]
fn a_killed_scratch_server_restarts_on_the_next_connection_with_every_acknowledged_commit() {
    let rt = rt();
    // No scheduled janitor and no idle suspend: the next connection alone must bring it back.
    let g = Gateway::start(
        Some(GOLDEN),
        Some("[janitor]\ninterval = \"0s\"\n[postgres]\nidle_suspend = \"0s\"\n"),
    );
    let t = g.issue("crash", 600);
    let id = s(&t, "id");
    let dsn = s(&t, "dsn");

    let mut r = Raw::login(g.pg_port, &full_token(&t));
    exec(&mut r, "update items set name = 'changed' where id = 1");
    exec(&mut r, "delete from items where id = 2");
    // One commit each, acknowledged one after the other, the last one just before the kill.
    for i in 0..COMMITS {
        exec(
            &mut r,
            &format!("insert into items values ({}, 'acked')", 5000 + i),
        );
    }
    // A busy backend does not notice its postmaster's death (an idle one does): it would
    // keep the old server's shared memory, and so the restart, blocked until it ends.
    let mut busy = Raw::login(g.pg_port, &full_token(&t));
    exec(&mut busy, "set statement_timeout = '120s'");
    busy.send(&wire::query(
        "select count(*) from generate_series(1, 2000000000) a",
    ));
    let running = rt.block_on(async {
        for _ in 0..6000 {
            let n = query_one(
                &dsn,
                "select count(*) from pg_stat_activity \
                 where state = 'active' and query like '%generate_series(1, 2000000000)%' \
                   and pid <> pg_backend_pid()",
            )
            .await
            .map_err(|e| sqlstate(&e))
            .expect("watching the busy session");
            if n.as_deref() == Some("1") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    });
    assert!(running, "the busy query never started");
    let (pid, _) = postmaster(&g, &id).expect("postmaster.pid");
    kill9(pid);

    // The session the crash cut learns it with an error that has a SQLSTATE (the server's
    // own FATAL or the gateway's 08006), then the connection closes.
    let _ = std::io::Write::write_all(&mut r.s, &wire::query("select 1"));
    assert_cut_with_an_error(&mut r);

    // A new connection with the same token works at once and sees every acknowledged write.
    rt.block_on(async {
        let c = match harness::connect(&dsn).await {
            Ok(c) => c,
            Err(e) => panic!(
                "connection after the crash: {}\n{}\n--- server log:\n{}",
                sqlstate(&e),
                g.log(),
                std::fs::read_to_string(g.instances_dir().join(&id).join("postgres.log"))
                    .unwrap_or_default()
            ),
        };
        let row = c
            .query_one(
                "select (select count(*) from items where name = 'acked'), \
                        (select name from items where id = 1), \
                        (select count(*) from items where id = 2)",
                &[],
            )
            .await
            .expect("query after the crash");
        assert_eq!(row.get::<_, i64>(0), COMMITS, "acknowledged commits lost");
        assert_eq!(row.get::<_, String>(1), "changed");
        assert_eq!(row.get::<_, i64>(2), 0);
    });
    // The busy session was cut too (its backend ended so the server could start again).
    assert_cut_with_an_error(&mut busy);
    let (pid2, _) = postmaster(&g, &id).expect("postmaster.pid after restart");
    assert_ne!(pid2, pid);
    assert!(pid_alive(pid2));

    // The review shows them.
    let review = diff(&g, &id);
    assert_eq!(
        changes(&review, "items"),
        (COMMITS as u64, 1, 1),
        "{review:#}"
    );

    // The janitor finds a server that died under a gateway that had it running, and restarts
    // it (no connection needed). A dry run only reports.
    kill9(pid2);
    let dry: Value = {
        let (code, v) = g.raw_call("POST", "/v1/reap?dry_run=true", None);
        assert_eq!(code, 200, "{v}");
        v
    };
    assert_eq!(dry["dead"], serde_json::json!([id]), "{dry}");
    assert!(postmaster(&g, &id).is_none_or(|(p, _)| !pid_alive(p)));
    let pass = reap(&g);
    assert_eq!(pass["dead"], serde_json::json!([id]), "{pass}");
    assert_eq!(pass["errors"], serde_json::json!([]), "{pass}");
    assert_eq!(pass["reaped"], serde_json::json!([]), "{pass}");
    let (pid3, _) = postmaster(&g, &id).expect("postmaster.pid after the janitor");
    assert!(
        pid3 != pid2 && pid_alive(pid3),
        "the janitor did not restart it"
    );
    assert_eq!(
        metrics(&g.api).get("sandpit_janitor_dead_backends_total"),
        Some(&1.0)
    );
    // A running server is not dead.
    assert_eq!(reap(&g)["dead"], serde_json::json!([]));
    let n = rt
        .block_on(query_one(
            &dsn,
            "select count(*) from items where name = 'acked'",
        ))
        .map_err(|e| sqlstate(&e))
        .expect("query after the janitor's restart");
    assert_eq!(n.as_deref(), Some(COMMITS.to_string().as_str()));

    let (code, _) = g.revoke(&id);
    assert_eq!(code, 200);
    let stored = diff(&g, &id);
    assert_eq!(changes(&stored, "items"), (COMMITS as u64, 1, 1));
}

#[test]
fn the_janitor_leaves_a_backend_suspended_while_idle_alone() {
    let rt = rt();
    let g = Gateway::start(
        Some(GOLDEN),
        Some("[janitor]\ninterval = \"0s\"\n[postgres]\nidle_suspend = \"1s\"\n"),
    );
    let t = g.issue("idle", 600);
    let id = s(&t, "id");
    let dsn = s(&t, "dsn");
    let one = rt
        .block_on(query_one(&dsn, "select 1"))
        .map_err(|e| sqlstate(&e))
        .expect("first connection");
    assert_eq!(one.as_deref(), Some("1"));
    let (pid, _) = postmaster(&g, &id).expect("postmaster.pid");
    assert!(
        wait_until(Duration::from_secs(60), || !pid_alive(pid)),
        "never suspended"
    );
    let pass = reap(&g);
    assert_eq!(pass["dead"], serde_json::json!([]), "{pass}");
    assert_eq!(pass["kept"], 1, "{pass}");
    assert!(postmaster(&g, &id).is_none_or(|(p, _)| !pid_alive(p)));
    // And the next connection starts it again.
    let one = rt
        .block_on(query_one(&dsn, "select 1"))
        .map_err(|e| sqlstate(&e))
        .expect("connection after the suspend");
    assert_eq!(one.as_deref(), Some("1"));
}

/// Directories of goldens built from the SQL file under a gateway's data dir.
fn sql_goldens(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("pg"))
        .expect("pg dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("golden-") && !n.contains('.'))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_typo_in_a_new_golden_sql_leaves_the_old_golden_serving() {
    let rt = rt();
    let tmp = harness::tempdir();
    let dir = tmp.path().to_path_buf();
    let mut g = Gateway::start_in(&dir, Some(GOLDEN), None);
    let t1 = g.issue("before", 600);
    let id1 = s(&t1, "id");
    let n = rt
        .block_on(query_one(
            &s(&t1, "dsn"),
            "insert into items values (7001, 'mine'); select 'ok'",
        ))
        .map_err(|e| sqlstate(&e))
        .expect("write before the change");
    assert_eq!(n.as_deref(), Some("ok"));
    let old = sql_goldens(&dir);
    assert_eq!(old.len(), 1);
    g.stop();
    drop(g);

    // The gateway still starts, with a loud error, and serves the old golden.
    let g = Gateway::start_in(&dir, Some("create table oops (;\n"), None);
    assert!(
        g.log().contains("THE GOLDEN SQL COULD NOT BE BUILT"),
        "{}",
        g.log()
    );
    assert_eq!(metrics(&g.api).get("sandpit_golden_sql_stale"), Some(&1.0));
    assert_eq!(sql_goldens(&dir), old, "the old golden changed");
    let t2 = g.issue("after", 600);
    let n = rt
        .block_on(query_one(&s(&t2, "dsn"), "select count(*) from items"))
        .map_err(|e| sqlstate(&e))
        .expect("a new token after the bad change");
    assert_eq!(n.as_deref(), Some("1000"));
    // The token from before still works and is reviewable.
    let review = diff(&g, &id1);
    assert_eq!(changes(&review, "items"), (1, 0, 0));
    assert!(review["schema"].as_array().is_some_and(|a| a.is_empty()));
    let dsn1 = harness::redial(&t1, &g);
    let n = rt
        .block_on(query_one(&dsn1, "select name from items where id = 7001"))
        .map_err(|e| sqlstate(&e))
        .expect("the earlier token after the bad change");
    assert_eq!(n.as_deref(), Some("mine"));
}

#[test]
fn a_changed_golden_sql_keeps_tokens_of_the_old_golden_reviewable_until_they_end() {
    let rt = rt();
    let tmp = harness::tempdir();
    let dir = tmp.path().to_path_buf();
    let mut g = Gateway::start_in(&dir, Some(GOLDEN), None);
    let t1 = g.issue("forked-from-old", 600);
    let id1 = s(&t1, "id");
    let n = rt
        .block_on(query_one(
            &s(&t1, "dsn"),
            "insert into items values (7001, 'mine'); \
             update items set name = 'renamed' where id = 3; select 'ok'",
        ))
        .map_err(|e| sqlstate(&e))
        .expect("write before the change");
    assert_eq!(n.as_deref(), Some("ok"));
    let old = sql_goldens(&dir);
    assert_eq!(old.len(), 1);
    g.stop();
    drop(g);

    let new_sql = format!("{GOLDEN}create table extra(x int);\ninsert into extra values (1);\n");
    let g = Gateway::start_in(&dir, Some(&new_sql), None);
    assert!(!g.log().contains("THE GOLDEN SQL COULD NOT BE BUILT"));
    assert_eq!(metrics(&g.api).get("sandpit_golden_sql_stale"), Some(&0.0));
    // Built beside the old one, which stays while a fork of it lives.
    let both = sql_goldens(&dir);
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(both.contains(&old[0]));
    let (code, goldens) = api_get(&g, "/v1/goldens");
    assert_eq!(code, 200, "{goldens}");
    let listed = goldens.to_string();
    let old_id = old[0].file_name().and_then(|n| n.to_str()).expect("name");
    assert!(listed.contains(old_id), "{goldens:#}");

    let t2 = g.issue("forked-from-new", 600);
    let n = rt
        .block_on(query_one(&s(&t2, "dsn"), "select count(*) from extra"))
        .map_err(|e| sqlstate(&e))
        .expect("a new token sees the new golden");
    assert_eq!(n.as_deref(), Some("1"));

    // The old token is reviewed against its own golden: its two changes, and no schema
    // change (against the new golden, table `extra` would look dropped).
    let review = diff(&g, &id1);
    assert_eq!(changes(&review, "items"), (1, 1, 0), "{review:#}");
    assert_eq!(review["schema"], serde_json::json!([]), "{review:#}");
    let (code, _) = g.revoke(&id1);
    assert_eq!(code, 200);
    let stored = dir
        .join("reviews")
        .join("forked-from-old")
        .join(format!("{id1}.json"));
    assert!(stored.is_file(), "no review stored at the end of the token");
    let stored: Value =
        serde_json::from_slice(&std::fs::read(&stored).expect("read review")).expect("json");
    assert_eq!(changes(&stored, "items"), (1, 1, 0), "{stored:#}");
    assert_eq!(stored["schema"], serde_json::json!([]));

    // Its last fork gone, the old golden goes too.
    assert!(
        wait_until(Duration::from_secs(60), || !old[0].exists()),
        "the old golden outlived its forks"
    );
    assert_eq!(sql_goldens(&dir).len(), 1);
    g.revoke(&s(&t2, "id"));
}
