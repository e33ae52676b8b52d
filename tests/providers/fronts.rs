//! Fronts that hold nothing: two `sandpit serve` processes sharing one Postgres registry
//! (the `tests/support/shared_pg.rs` server, also the `template` provider's) and one
//! `registry.shared_dir`. One token's sessions go through both; its statement log, read
//! from either front, is one log with both fronts' statements in the order they ran; a
//! front killed with SIGKILL mid-statement loses no acknowledged statement (and the one it
//! was running is logged, unfinished), its client reconnects through the other front, and
//! the front started again on its data dir goes on with its own file; the review stored at
//! revoke holds both fronts' statements and is read from the other front, as is a decision.

use crate::support::harness;
use crate::support::shared_pg;

use std::path::Path;
use std::time::Duration;

use crate::support::harness::{connect, Gateway, SMALL_GOLDEN};
use serde_json::Value;

fn front_id(g: &Gateway) -> String {
    std::fs::read_to_string(g.data_dir.join("gateway.id"))
        .expect("gateway.id")
        .trim()
        .to_string()
}

/// The token's whole statement log as one front's API gives it.
fn statements(g: &Gateway, id: &str) -> Vec<Value> {
    let (status, v) = g.raw_call(
        "GET",
        &format!("/v1/tokens/{id}/statements?limit=1000"),
        None,
    );
    assert_eq!(status, 200, "{v}");
    v.as_array().expect("array").clone()
}

/// The log as read from `g` once it holds `n` statements, each with its outcome but those
/// whose text is `unfinished` (outcomes a session deferred are written when it goes idle).
fn settled(g: &Gateway, id: &str, n: usize, unfinished: &str) -> Vec<Value> {
    let mut last = Vec::new();
    let done = harness::wait_until(Duration::from_secs(60), || {
        last = statements(g, id);
        last.len() == n
            && last
                .iter()
                .all(|s| !s["outcome"].is_null() || s["text"] == unfinished)
    });
    assert!(done, "{n} statements with outcomes: {last:#?}");
    last
}

fn texts(log: &[Value]) -> Vec<&str> {
    log.iter()
        .map(|s| s["text"].as_str().expect("text"))
        .collect()
}

/// (front, front_seq) of each statement.
fn origins(log: &[Value]) -> Vec<(String, u64)> {
    log.iter()
        .map(|s| {
            (
                s["front"].as_str().expect("front").to_string(),
                s["front_seq"].as_u64().expect("front_seq"),
            )
        })
        .collect()
}

fn front_files(shared: &Path, task: &str, id: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(shared.join("logs").join(task).join(id))
        .expect("the token's log directory in the shared dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The registry server, a shared directory, and the config every front gets.
pub(super) fn setup(
    rt: &tokio::runtime::Runtime,
    extra: &str,
) -> (shared_pg::SharedPg, tempfile::TempDir, String) {
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let registry_url = rt.block_on(pg.registry_database());
    let shared = harness::tempdir();
    let cfg = format!(
        "provider = \"template\"\n\
         [template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\nsslmode = \"require\"\n\
         [registry]\nurl = \"{registry_url}\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\n\
         refresh_interval = \"1s\"\nshared_dir = \"{}\"\n{extra}",
        pg.admin_dsn(),
        pg.ca_file.display(),
        shared.path().display()
    );
    (pg, shared, cfg)
}

#[test]
fn two_fronts_keep_one_log_one_review_and_lose_nothing_to_a_kill() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let (_pg, shared, cfg) = setup(&rt, "");
    let a = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let mut b = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let (fa, fb) = (front_id(&a), front_id(&b));
    assert_ne!(fa, fb);
    let task = "fronts-one-log";
    let t = a.issue(task, 600);
    let id = t["id"].as_str().expect("id").to_string();

    // One token's statements, alternately through both fronts, each acknowledged before
    // the next is sent.
    let ran = [
        ("a", "create table notes(id int primary key, body text)"),
        ("b", "insert into notes values (1, 'via b')"),
        ("a", "insert into notes values (2, 'via a')"),
        ("b", "select 1/0 as failed_on_b"),
        ("a", "select 1/0 as failed_on_a"),
    ];
    rt.block_on(async {
        let ca = connect(&harness::redial(&t, &a))
            .await
            .expect("session on A");
        let cb = connect(&harness::redial(&t, &b))
            .await
            .expect("session on B");
        for (front, sql) in ran {
            let c = if front == "a" { &ca } else { &cb };
            let r = c.batch_execute(sql).await;
            assert_eq!(r.is_err(), sql.contains("1/0"), "{sql}: {r:?}");
        }
    });
    let from_a = settled(&a, &id, ran.len(), "");
    let from_b = settled(&b, &id, ran.len(), "");
    assert_eq!(from_a, from_b, "one log, whichever front reads it");
    assert_eq!(texts(&from_a), ran.map(|(_, sql)| sql));
    let seqs: Vec<u64> = from_a
        .iter()
        .map(|s| s["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(
        origins(&from_a),
        [(&fa, 1), (&fb, 1), (&fa, 2), (&fb, 2), (&fa, 3)].map(|(f, s)| (f.clone(), s))
    );
    assert_eq!(
        from_a[3]["outcome"]["sqlstate"], "22012",
        "{:#?}",
        from_a[3]
    );
    let mut want = vec![format!("{fa}.jsonl"), format!("{fb}.jsonl")];
    want.sort();
    assert_eq!(front_files(shared.path(), task, &id), want);
    // Nothing of the token's log in either front's own data dir.
    assert!(!a.data_dir.join("logs").join(task).exists());
    assert!(!b.data_dir.join("logs").join(task).exists());

    // B is killed with SIGKILL while a statement of its runs; what it acknowledged before
    // is in the log, and the running statement too (written before it was forwarded).
    let acked: Vec<String> = (1..=3)
        .map(|i| format!("insert into notes values ({}, 'acked-{i}')", 10 + i))
        .collect();
    let sleeping = "select pg_sleep(60) as killed_mid_statement";
    rt.block_on(async {
        let watcher = connect(&harness::redial(&t, &a))
            .await
            .expect("watcher on A");
        let cb = connect(&harness::redial(&t, &b))
            .await
            .expect("session on B");
        for sql in &acked {
            cb.batch_execute(sql).await.expect("acknowledged through B");
        }
        let running = tokio::spawn(async move { cb.simple_query(sleeping).await });
        harness::wait_running(&watcher, sleeping).await;
        b.kill();
        let e = running.await.expect("join").expect_err("B died under it");
        assert!(e.is_closed() || e.code().is_none(), "{e:?}");
        // The client reconnects through A and finds everything B acknowledged.
        let again = connect(&harness::redial(&t, &a))
            .await
            .expect("reconnect through A");
        let n: i64 = again
            .query_one("select count(*) from notes where body like 'acked-%'", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(n, 3);
    });
    let log = statements(&a, &id);
    for sql in &acked {
        let s = log
            .iter()
            .find(|s| s["text"] == sql.as_str())
            .unwrap_or_else(|| panic!("{sql} lost: {log:#?}"));
        assert_eq!(s["front"], fb.as_str());
        assert!(
            !s["outcome"].is_null(),
            "acknowledged, so its outcome went out with the next record: {s}"
        );
    }
    let killed = log
        .iter()
        .find(|s| s["text"] == sleeping)
        .unwrap_or_else(|| panic!("the statement B ran when killed: {log:#?}"));
    assert!(killed["outcome"].is_null(), "{killed}");
    let b_last = killed["front_seq"].as_u64().expect("front_seq");

    // B again on its data dir: the same front id, its own file continued.
    let b2 = Gateway::start_in(&b.data_dir, Some(SMALL_GOLDEN), Some(&cfg));
    assert_eq!(front_id(&b2), fb);
    rt.block_on(async {
        let c = connect(&harness::redial(&t, &b2))
            .await
            .expect("session on B again");
        c.batch_execute("insert into notes values (100, 'after restart')")
            .await
            .expect("write through the restarted B");
    });
    let total = log.len() + 1;
    let log = settled(&a, &id, total, sleeping);
    let last = log.last().expect("last");
    assert_eq!(
        last["text"],
        "insert into notes values (100, 'after restart')"
    );
    assert_eq!(
        (last["front"].as_str(), last["front_seq"].as_u64()),
        (Some(fb.as_str()), Some(b_last + 1))
    );

    // Revoked on A; the review A stored is read from B, with both fronts' statements.
    let (status, v) = a.revoke(&id);
    assert_eq!(status, 200, "{v}");
    let (status, review) = b2.raw_call("GET", &format!("/v1/tokens/{id}/diff"), None);
    assert_eq!(status, 200, "{review}");
    let summary = &review["statements"];
    assert_eq!(summary["total"], total as u64, "{summary}");
    assert_eq!(summary["unfinished"], 1, "the killed statement: {summary}");
    let failed: Vec<&str> = summary["failed"]
        .as_array()
        .expect("failed")
        .iter()
        .map(|f| f["text"].as_str().expect("text"))
        .collect();
    assert_eq!(
        failed,
        ["select 1/0 as failed_on_b", "select 1/0 as failed_on_a"]
    );
    assert_eq!(
        statements(&b2, &id),
        log,
        "the ended token's log, from the other front"
    );

    // A decision taken on B is the one A shows.
    let (status, v) = b2.raw_call(
        "POST",
        &format!("/v1/tokens/{id}/reject"),
        Some(serde_json::json!({"comment": "rejected on B"})),
    );
    assert_eq!(status, 200, "{v}");
    let (status, shown) = a.raw_call("GET", &format!("/v1/tokens/{id}/review"), None);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["state"], "rejected", "{shown}");
    assert!(shown.to_string().contains("rejected on B"), "{shown}");
    drop(b2);
}

/// A token's `max_connections` counts its sessions on every front; a front killed with
/// SIGKILL stops holding its sessions' places once its lease runs out.
#[test]
fn max_connections_holds_across_fronts_and_a_dead_fronts_sessions_expire() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let (_pg, _shared, cfg) = setup(&rt, "session_lease = \"2s\"\n");
    let mut a = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let b = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let t = a.issue_with(
        serde_json::json!({"task": "fronts-limit", "ttl_seconds": 600, "max_connections": 2}),
    );
    rt.block_on(async {
        let on_a = connect(&harness::redial(&t, &a))
            .await
            .expect("first session, on A");
        let on_b = connect(&harness::redial(&t, &b))
            .await
            .expect("second session, on B");
        for (g, name) in [(&a, "A"), (&b, "B")] {
            let e = connect(&harness::redial(&t, g))
                .await
                .expect_err("a third session on either front");
            assert_eq!(harness::sqlstate(&e), "53300", "on {name}: {e:?}");
        }
        // A place freed on B is taken on A.
        drop(on_b);
        let again = async {
            loop {
                match connect(&harness::redial(&t, &a)).await {
                    Ok(c) => return c,
                    Err(e) => assert_eq!(harness::sqlstate(&e), "53300", "{e:?}"),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let second_on_a = tokio::time::timeout(Duration::from_secs(60), again)
            .await
            .expect("B's ended session frees its place");
        let e = connect(&harness::redial(&t, &b))
            .await
            .expect_err("A holds both places");
        assert_eq!(harness::sqlstate(&e), "53300", "{e:?}");

        // A dies holding both places; once its lease runs out, B admits sessions again.
        a.kill();
        drop((on_a, second_on_a));
        let freed = async {
            loop {
                match connect(&harness::redial(&t, &b)).await {
                    Ok(c) => return c,
                    Err(e) => assert_eq!(harness::sqlstate(&e), "53300", "{e:?}"),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let c = tokio::time::timeout(Duration::from_secs(120), freed)
            .await
            .expect("the dead front's sessions stop counting");
        let _second = connect(&harness::redial(&t, &b))
            .await
            .expect("both places free");
        let e = connect(&harness::redial(&t, &b))
            .await
            .expect_err("and the limit still holds");
        assert_eq!(harness::sqlstate(&e), "53300", "{e:?}");
        c.simple_query("select 1").await.expect("served");
    });
}
