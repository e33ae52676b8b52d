//! The seatbelt policy: statement kinds a token may run, on top of (never instead of) the
//! scratch database.

use crate::support::harness::{connect, psql, sqlstate, Gateway, SMALL_GOLDEN};
use crate::support::wire::{self, Raw};

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

/// The errors of a response up to its ReadyForQuery, as "SQLSTATE message".
fn errors(raw: &mut Raw) -> Vec<String> {
    raw.until_ready()
        .iter()
        .filter(|(t, _)| *t == b'E')
        .map(|(_, b)| format!("{} {}", wire::field(b, b'C'), wire::field(b, b'M')))
        .collect()
}

/// A hostile agent on a read-only token hides a write from the gateway's lexer: with
/// `standard_conforming_strings` off (set from a SELECT), in a client-only encoding, or
/// behind nested comments. Each is refused by the gateway's policy itself (not only by the
/// backend role, whose refusal says "permission denied"), and nothing is deleted.
#[test]
fn texts_read_otherwise_by_the_server_are_refused_by_the_policy() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let t =
        g.issue_with(serde_json::json!({"task": "lexer", "ttl_seconds": 600, "allow": ["read"]}));
    let mut raw = Raw::login(
        g.pg_port,
        &wire::full_token(t["dsn"].as_str().expect("dsn")),
    );
    let refused = |errs: &[String], what: &str| {
        assert!(
            errs.len() == 1 && errs[0].starts_with("42501 sandpit policy"),
            "{what}: {errs:?}"
        );
    };

    raw.send(&wire::query(
        "select set_config('standard_conforming_strings', 'off', false)",
    ));
    assert_eq!(errors(&mut raw), Vec::<String>::new());
    raw.send(&wire::query("select '\\' , ' ; delete from items; --'"));
    refused(
        &errors(&mut raw),
        "a write after a string the server ends later",
    );
    // Extended protocol: one statement, a data-modifying WITH only the server sees.
    let cte =
        "with a as (select '\\', ' ), d as (delete from items returning 1) select 1 --' ) select 1";
    for m in [
        wire::parse("", cte),
        wire::bind("", ""),
        wire::execute("", 0),
        wire::sync(),
    ] {
        raw.send(&m);
    }
    refused(&errors(&mut raw), "a CTE hidden in a string");
    raw.send(&wire::query(
        "select set_config('standard_conforming_strings', 'on', false)",
    ));
    assert_eq!(errors(&mut raw), Vec::<String>::new());

    // Shift-JIS 0x81 0x5C is one character whose second byte is a backslash.
    raw.send(&wire::query(
        "select set_config('client_encoding', 'SJIS', false)",
    ));
    assert_eq!(errors(&mut raw), Vec::<String>::new());
    let q: Vec<u8> = [
        &b"select E'"[..],
        &[0x81, 0x5c],
        b"' ; delete from items; --'\0",
    ]
    .concat();
    raw.send(&wire::msg(b'Q', &q));
    refused(&errors(&mut raw), "a backslash that is half of a character");
    raw.send(&wire::query(
        "select set_config('client_encoding', 'UTF8', false)",
    ));
    assert_eq!(errors(&mut raw), Vec::<String>::new());

    raw.send(&wire::query(
        "/* /* */ select */ delete from items * where true",
    ));
    refused(&errors(&mut raw), "a write behind nested comments");
    raw.send(&wire::query("-- select\rdelete from items * where true"));
    refused(
        &errors(&mut raw),
        "a write after a line comment ended by CR",
    );

    // Past the splitter's bound, or a body it cannot part: judged whole, not by its start.
    let many = format!("{}delete from items", "select 1;".repeat(1000));
    raw.send(&wire::query(&many));
    refused(&errors(&mut raw), "a write after 1000 reads");
    raw.send(&wire::query("prepare p as delete from items"));
    refused(&errors(&mut raw), "a prepared write");

    raw.send(&wire::query("select count(*) from items"));
    let rows: Vec<String> = raw
        .until_ready()
        .iter()
        .filter(|(t, _)| *t == b'D')
        .filter_map(|(_, b)| wire::first_column(b))
        .collect();
    assert_eq!(rows, ["1000"]);
}
