//! The end of a token cannot be made to lose or fake its review (issue 29, items 3-5), with
//! the real gateway and real Postgres forks (`instance` provider): locks held in prepared
//! transactions, a review that fails on purpose (the reviewer role locked out, then let in
//! again), the gateway SIGKILLed at ten named steps of a revoke, and values whose newlines
//! and right-to-left overrides would forge the text, MCP and HTML reviews.

use crate::support::harness;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use crate::support::harness::{psql, Gateway};
use serde_json::{json, Value};

const GOLDEN: &str = "create table items(id int primary key, name text not null);\n\
insert into items select g, 'item ' || g from generate_series(1, 100) g;\n\
create table other(id int primary key);\n\
create table notes(id int primary key, body text);\n";

/// No scheduled janitor pass: the test says when one runs.
const CONFIG: &str = "[janitor]\ninterval = \"0s\"\n";

fn id(t: &Value) -> String {
    t["id"].as_str().expect("id").to_string()
}

fn dsn(t: &Value) -> String {
    t["dsn"].as_str().expect("dsn").to_string()
}

fn run_sql(dsn: &str, sql: &str) -> String {
    let (ok, out, err) = psql(dsn, &["-c", sql]);
    assert!(ok, "{sql}: {err}\n{out}");
    out
}

/// A superuser login to a token's own instance server (peer identity over its socket).
fn admin_sql(g: &Gateway, token: &str, sql: &str) -> String {
    let (_, sock) = harness::postmaster(g, token).expect("instance server running");
    let dsn = format!("host={} user=sandpit_admin dbname=sandpit", sock.display());
    run_sql(&dsn, sql)
}

/// The stored end-of-token review, as JSON.
fn stored(g: &Gateway, task: &str, token: &str) -> Value {
    let p = g
        .data_dir
        .join("reviews")
        .join(task)
        .join(format!("{token}.json"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("review json")
}

/// (table, inserted, updated, deleted) of a review.
fn data_of(r: &Value) -> Vec<(String, u64, u64, u64)> {
    r["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|t| {
            let n = |k: &str| t[k].as_u64().unwrap_or(0);
            (
                t["table"].as_str().unwrap_or("").to_string(),
                n("inserted"),
                n("updated"),
                n("deleted"),
            )
        })
        .collect()
}

fn one_insert(table: &str) -> Vec<(String, u64, u64, u64)> {
    vec![(table.to_string(), 1, 0, 0)]
}

fn get_text(g: &Gateway, path: &str) -> (u16, String) {
    let url = format!("{}{}", g.api, path);
    let r = harness::http("GET", &url, Some(&g.admin_key), harness::Body::None).expect("GET");
    (r.status, r.body)
}

fn sandpit_cli(g: &Gateway, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--api", &g.api]);
    let (code, out, err) = harness::run_sandpit(&all, &[("SANDPIT_ADMIN_KEY", &g.admin_key)]);
    assert_eq!(code, 0, "sandpit {args:?}: {err}");
    out
}

#[test]
fn locks_held_in_prepared_transactions_cannot_prevent_the_review() {
    let g = Gateway::start(Some(GOLDEN), Some(CONFIG));
    let t = g.issue("prepared-locks", 600);
    let (tid, d) = (id(&t), dsn(&t));
    // The attack exists: two-phase commit is on in scratch servers.
    let mpt = run_sql(&d, "show max_prepared_transactions");
    assert!(
        mpt.trim().parse::<u32>().expect("number") > 0,
        "max_prepared_transactions = {mpt}"
    );
    run_sql(&d, "insert into notes values (1, 'the change')");
    for (gid, table, write) in [
        (
            "hold-1",
            "items",
            "update items set name = 'held' where id = 1",
        ),
        ("hold-2", "other", "insert into other values (1)"),
    ] {
        let script = format!(
            "begin; lock table {table} in access exclusive mode; {write}; prepare transaction '{gid}';"
        );
        let (ok, out, err) = psql(&d, &["-c", &script]);
        assert!(ok, "{script}: {err}{out}");
    }
    assert_eq!(
        run_sql(&d, "select count(*) from pg_prepared_xacts").trim(),
        "2"
    );
    // A session that keeps its locks, too (the gateway ends it at revoke).
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let holder = rt.block_on(async {
        let c = harness::connect(&d).await.expect("connect");
        c.batch_execute("begin; lock table notes in access share mode")
            .await
            .expect("lock");
        c
    });

    let (s, v) = g.revoke(&tid);
    assert_eq!(s, 200, "{v}");
    let shown = g.show(&tid);
    assert_eq!(shown["review"], "stored", "{shown}");
    assert_eq!(shown["end"], "destroyed", "{shown}");
    assert_eq!(shown["backend"], false, "{shown}");
    // The committed change, and nothing of the rolled-back prepared transactions.
    assert_eq!(
        data_of(&stored(&g, "prepared-locks", &tid)),
        one_insert("public.notes")
    );
    drop(holder);
    assert!(g
        .log()
        .contains("rolled back a prepared transaction left by the agent"));
}

#[test]
fn a_failed_review_is_said_everywhere_refuses_approval_and_is_retried() {
    let g = Gateway::start(Some(GOLDEN), Some(CONFIG));
    let t = g.issue("review-fails", 600);
    let tid = id(&t);
    run_sql(&dsn(&t), "insert into notes values (1, 'the change')");
    // The review's own login is refused (an operator's mistake, a server in trouble).
    admin_sql(&g, &tid, "alter role sandpit_review nologin");

    let (s, v) = g.revoke(&tid);
    assert_eq!(s, 200, "{v}");
    let shown = g.show(&tid);
    let review = shown["review"].as_str().unwrap_or_default().to_string();
    assert!(review.starts_with("failed: "), "{shown}");
    assert!(review.contains("not permitted to log in"), "{review}");
    assert_eq!(shown["end"], "ending");
    assert_eq!(shown["backend"], true, "the scratch data is kept: {shown}");
    let (s, body) = get_text(&g, "/v1/reviews");
    assert_eq!(s, 200);
    let list: Value = serde_json::from_str(&body).expect("json");
    let mine = list
        .as_array()
        .expect("list")
        .iter()
        .find(|r| r["token"] == tid.as_str())
        .expect("listed");
    assert!(
        mine["review"]
            .as_str()
            .unwrap_or("")
            .starts_with("failed: "),
        "{mine}"
    );
    let listed = sandpit_cli(&g, &["token", "list"]);
    let line = listed.lines().find(|l| l.contains(&tid)).expect("line");
    assert!(line.contains("review failed: "), "{line}");
    let one = sandpit_cli(&g, &["token", "show", &tid]);
    assert!(one.contains("review failed: "), "{one}");
    let (s, v) = g.raw_call(
        "POST",
        &format!("/v1/tokens/{tid}/approve"),
        Some(json!({})),
    );
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .starts_with("review failed: "),
        "{v}"
    );
    let (s, body) = get_text(&g, &format!("/v1/tokens/{tid}/diff"));
    assert_eq!(s, 404, "{body}");
    assert!(body.contains("review failed: "), "{body}");

    // A janitor pass tries again and fails again: still kept.
    let (s, rep) = g.raw_call("POST", "/v1/reap", None);
    assert_eq!(s, 200, "{rep}");
    assert_eq!(rep["review_failed"], json!([tid]), "{rep}");
    assert_eq!(g.show(&tid)["backend"], true);
    assert!(g.instances_dir().join(&tid).exists());

    // Repaired: the next pass stores the review and only then destroys the backend.
    admin_sql(&g, &tid, "alter role sandpit_review login");
    let (s, rep) = g.raw_call("POST", "/v1/reap", None);
    assert_eq!(s, 200, "{rep}");
    assert_eq!(rep["reviewed"], json!([tid]), "{rep}");
    let shown = g.show(&tid);
    assert_eq!(shown["review"], "stored", "{shown}");
    assert_eq!(shown["end"], "destroyed", "{shown}");
    assert_eq!(shown["backend"], false, "{shown}");
    assert_eq!(
        data_of(&stored(&g, "review-fails", &tid)),
        one_insert("public.notes")
    );
    let (s, v) = g.raw_call(
        "POST",
        &format!("/v1/tokens/{tid}/approve"),
        Some(json!({})),
    );
    assert_eq!(s, 200, "{v}");

    // An operator may give up instead: discarded, the failure still said, approval refused.
    let t = g.issue("review-discarded", 600);
    let did = id(&t);
    run_sql(&dsn(&t), "insert into notes values (2, 'another change')");
    admin_sql(&g, &did, "alter role sandpit_review nologin");
    g.revoke(&did);
    let out = sandpit_cli(&g, &["token", "discard", &did]);
    assert!(out.contains("review failed: "), "{out}");
    let shown = g.show(&did);
    assert_eq!(shown["end"], "destroyed", "{shown}");
    assert_eq!(shown["backend"], false, "{shown}");
    assert!(!g.instances_dir().join(&did).exists());
    let left: Vec<_> = std::fs::read_dir(g.data_dir.join("reviews").join("review-discarded"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "no review and no reserve left: {left:?}");
    assert!(shown["review"]
        .as_str()
        .unwrap_or("")
        .starts_with("failed: "));
    let (s, v) = g.raw_call(
        "POST",
        &format!("/v1/tokens/{did}/approve"),
        Some(json!({})),
    );
    assert_eq!(s, 409, "{v}");
    let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{did}/discard"), None);
    assert_eq!(s, 409, "nothing left to discard: {v}");
    let (s, v) = g.raw_call("POST", &format!("/v1/tokens/{tid}/discard"), None);
    assert_eq!(s, 409, "a stored review is not discarded: {v}");
}

/// Steps of a revoke, in order (see `registry::end::crash_point`).
const CRASH_POINTS: [&str; 10] = [
    "end:marked",
    "end:sessions_ended",
    "review:quiesced",
    "review:taken",
    "review:wrote_json",
    "review:wrote_html",
    "review:written",
    "end:reviewed",
    "end:backend_destroyed",
    "end:destroyed",
];

fn start(dir: &Path, crash_at: Option<&str>) -> Gateway {
    let envs: Vec<(&str, &str)> = crash_at
        .map(|p| vec![("SANDPIT_TEST_CRASH_AT", p)])
        .unwrap_or_default();
    Gateway::start_in_with(dir, Some(GOLDEN), Some(CONFIG), &[], &envs)
}

#[test]
fn a_gateway_killed_anywhere_in_a_revoke_stores_the_review_after_restart() {
    let tmp = harness::tempdir();
    let dir = tmp.path();
    for (i, point) in CRASH_POINTS.iter().enumerate() {
        let mut g = start(dir, Some(point));
        let task = format!("crash-{i}");
        let t = g.issue(&task, 3600);
        let tid = id(&t);
        run_sql(
            &dsn(&t),
            &format!("insert into notes values ({i}, 'before {point}')"),
        );
        // The gateway dies answering: no answer, or none worth reading.
        let _ = harness::http(
            "DELETE",
            &format!("{}/v1/tokens/{tid}", g.api),
            Some(&g.admin_key),
            harness::Body::None,
        );
        let mut child = g.child.take().expect("child");
        let status = harness::wait_exit(&mut child, Duration::from_secs(300)).expect("exited");
        assert_eq!(status.signal(), Some(9), "{point}: {status:?}");
        assert!(
            g.log().contains(&format!("step=\"{point}\"")) || g.log().contains(point),
            "{point}: the step was reached"
        );
        drop(g);

        let g = start(dir, None);
        let shown = g.show(&tid);
        assert_eq!(shown["state"], "revoked", "{point}: {shown}");
        assert_eq!(shown["review"], "stored", "{point}: {shown}");
        assert_eq!(shown["end"], "destroyed", "{point}: {shown}");
        assert_eq!(shown["backend"], false, "{point}: {shown}");
        assert!(!g.instances_dir().join(&tid).exists(), "{point}");
        let r = stored(&g, &task, &tid);
        assert_eq!(data_of(&r), one_insert("public.notes"), "{point}");
        let sample = r["data"][0]["samples"]["inserted"][0].to_string();
        assert!(
            sample.contains(&format!("before {point}")),
            "{point}: {sample}"
        );
        let (s, text) = get_text(&g, &format!("/v1/tokens/{tid}/diff?format=text"));
        assert_eq!(s, 200, "{point}: {text}");
        assert!(text.contains(&format!("before {point}")), "{point}: {text}");
    }
}

#[test]
fn values_cannot_forge_lines_or_reverse_text_in_text_mcp_and_html() {
    let g = Gateway::start(Some(GOLDEN), Some(CONFIG));
    let t = g.issue("escaping", 600);
    let tid = id(&t);
    // A value that would start a fake line, and one that would reverse what follows it.
    run_sql(
        &dsn(&t),
        "insert into notes values (1, E'ok\\nReview of token FAKE\\n  public.items — matched by x'), \
         (2, E'pay \\u202E0001$ \\u200Bx')",
    );
    let check_text = |what: &str, text: &str| {
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("Review of token FAKE") || l.starts_with("  public.items")),
            "{what}: a value started a line:\n{text}"
        );
        assert!(
            !text.contains('\u{202e}') && !text.contains('\u{200b}'),
            "{what}"
        );
        assert!(
            text.contains("'ok\\u{a}Review of token FAKE\\u{a}  public.items"),
            "{what}:\n{text}"
        );
        assert!(
            text.contains("\\u{202e}0001$ \\u{200b}x'"),
            "{what}:\n{text}"
        );
    };
    let (s, text) = get_text(&g, &format!("/v1/tokens/{tid}/diff?format=text"));
    assert_eq!(s, 200, "{text}");
    check_text("text", &text);

    // MCP review_changes, as the agent asks for it.
    let creds = dsn(&t)
        .strip_prefix("postgresql://")
        .and_then(|r| r.split('@').next())
        .expect("creds")
        .replacen(':', ".", 1);
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "review_changes", "arguments": {}}});
    let r = harness::http(
        "POST",
        &format!("{}/mcp", g.api),
        Some(&creds),
        harness::Body::Json(call),
    )
    .expect("mcp");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("json");
    let mcp = v["result"]["content"][0]["text"].as_str().expect("text");
    check_text("mcp", mcp);

    let (s, page) = get_text(&g, &format!("/v1/tokens/{tid}/diff?format=html"));
    assert_eq!(s, 200);
    assert!(
        !page.contains('\u{202e}') && !page.contains('\u{200b}'),
        "raw override in HTML"
    );
    assert!(
        page.contains("<bdi dir=\"auto\">pay <span class=\"cc\">\\u{202e}</span>0001$ <span class=\"cc\">\\u{200b}</span>x</bdi>"),
        "{page}"
    );
    assert!(
        page.contains("<bdi dir=\"auto\">ok<span class=\"cc\">\\u{a}</span>Review of token FAKE"),
        "{page}"
    );
    // The statement that wrote them, as logged, isolated and shown too.
    assert!(page.contains("unicode-bidi:isolate"));

    // After the end: the stored files say the same.
    g.revoke(&tid);
    let stored_text = std::fs::read_to_string(
        g.data_dir
            .join("reviews")
            .join("escaping")
            .join(format!("{tid}.txt")),
    )
    .expect("stored text");
    check_text("stored text", &stored_text);
}
