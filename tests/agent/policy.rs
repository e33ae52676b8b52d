//! The seatbelt policy: statement kinds a token may run, on top of (never instead of) the
//! scratch database.

use crate::support::harness::{connect, psql, sqlstate, Gateway, SMALL_GOLDEN};

#[test]
fn a_read_only_token_reads_and_is_refused_everything_else() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let t = g.issue_with(serde_json::json!({"task": "read-only", "ttl_seconds": 600, "allow": ["read", "transaction"]}));
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    assert_eq!(
        g.show(&id)["allow"],
        serde_json::json!(["read", "transaction"])
    );

    let (ok, out, err) = psql(&dsn, &["-c", "select count(*) from items"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1000");
    let (ok, _, err) = psql(&dsn, &["-c", "delete from items"]);
    assert!(
        !ok && err.contains("sandpit policy") && err.contains("write"),
        "{err}"
    );
    let (ok, _, err) = psql(&dsn, &["-c", "select 1; delete from items"]);
    assert!(!ok && err.contains("sandpit policy"), "{err}");
    let (ok, _, err) = psql(&dsn, &["-c", "do $$ begin delete from items; end $$"]);
    assert!(!ok && err.contains("unparsed"), "{err}");
    // Nothing of it reached the backend.
    let (ok, out, err) = psql(&dsn, &["-c", "select count(*) from items"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1000");

    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn).await.expect("connect");
        // Extended protocol: refused with 42501 at Execute.
        let e = c
            .execute("update items set name = $1", &[&"x"])
            .await
            .expect_err("refused");
        assert_eq!(sqlstate(&e), "42501");
        let n: i64 = c
            .query_one("select count(*) from items where name = 'x'", &[])
            .await
            .expect("q")
            .get(0);
        assert_eq!(n, 0);
        // Inside a transaction the refusal is a real error: the transaction is aborted.
        c.batch_execute("begin").await.expect("begin");
        let e = c
            .simple_query("create table t(x int)")
            .await
            .expect_err("refused");
        assert_eq!(sqlstate(&e), "42501");
        let e = c.simple_query("select 1").await.expect_err("aborted");
        assert_eq!(sqlstate(&e), "25P02");
        c.batch_execute("rollback").await.expect("rollback");
        c.simple_query("select 1").await.expect("usable again");
    });

    let (s, log) = g.raw_call("GET", &format!("/v1/tokens/{id}/statements"), None);
    assert_eq!(s, 200);
    let log = log.as_array().cloned().unwrap_or_default();
    let denied: Vec<&str> = log
        .iter()
        .filter(|s| s["outcome"]["denied"] == true)
        .map(|s| s["text"].as_str().unwrap_or(""))
        .collect();
    assert!(denied.contains(&"delete from items"), "{denied:?}");
    assert!(
        denied.contains(&"do $$ begin delete from items; end $$"),
        "{denied:?}"
    );
    assert!(denied.contains(&"update items set name = $1"), "{denied:?}");
    assert!(denied.contains(&"create table t(x int)"), "{denied:?}");
    let skipped_select = log
        .iter()
        .any(|s| s["text"] == "select 1" && s["outcome"]["skipped"] == true);
    assert!(
        skipped_select,
        "the allowed half of a rejected string is logged as not run"
    );

    // Bad policies are refused at issue.
    let (s, v) = g.raw_call(
        "POST",
        "/v1/tokens",
        Some(serde_json::json!({"task": "x", "allow": ["unparsed"]})),
    );
    assert_eq!(s, 400, "{v}");
}
