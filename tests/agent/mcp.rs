//! MCP server mode, driven by the official MCP Python SDK (tests/mcp/client.py) over stdio
//! (`sandpit mcp` with SANDPIT_DSN) and over streamable HTTP (`POST /mcp` on the API), plus
//! the protocol edges checked on raw JSON-RPC.

use crate::support::harness;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/client.py");

fn run_client(args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new("python3")
        .arg(CLIENT)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

fn check_scenario(v: &Value) {
    // The client (SDK 2.x) asks for 2025-11-25; the server answers with its newest, which
    // the client accepts.
    assert_eq!(v["protocol_version"], "2025-06-18");
    assert_eq!(v["server_name"], "sandpit");
    let tools = v["tools"].as_object().expect("tools");
    let mut names: Vec<_> = tools.keys().cloned().collect();
    names.sort();
    assert_eq!(names, ["describe_schema", "review_changes", "run_sql"]);
    let schema = &tools["run_sql"];
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["required"], json!(["sql"]));
    assert_eq!(schema["additionalProperties"], json!(false));
    let props: Vec<_> = schema["properties"]
        .as_object()
        .expect("props")
        .keys()
        .collect();
    assert_eq!(props, ["sql"]);

    let count = |k: &str| -> u64 {
        let t = v[k]["text"].as_str().unwrap_or("");
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            (lines.len(), lines[0], lines[2]),
            (3, "n", "(1 row)"),
            "{t}"
        );
        lines[1].parse().expect("count")
    };
    let before = count("count_before");
    assert!(before >= 5000, "{before}");
    assert_eq!(v["delete"]["is_error"], false);
    assert_eq!(v["delete"]["text"], "OK, 10 rows affected\n");
    assert_eq!(count("count_after"), before - 10);

    let capped = v["capped"]["text"].as_str().expect("capped text");
    assert_eq!(v["capped"]["is_error"], false);
    let lines: Vec<&str> = capped.lines().collect();
    assert!(lines[0].starts_with("id | customer_id"), "{}", lines[0]);
    // header + 200 rows + "(200 rows)" + the gateway's notice
    assert_eq!(lines.len(), 203, "{capped:.500}");
    assert_eq!(lines[201], "(200 rows)");
    assert!(
        lines[202].starts_with("NOTICE 01000: sandpit: result cut at 200 rows"),
        "{}",
        lines[202]
    );

    assert_eq!(v["error"]["is_error"], true);
    assert_eq!(
        v["error"]["text"],
        "ERROR 42P01: relation \"no_such_table\" does not exist"
    );
    assert_eq!(v["after_error"]["text"], "one\n1\n(1 row)\n");

    let describe = v["describe"]["text"].as_str().expect("describe");
    assert!(
        describe.starts_with("table | kind | columns | keys\n"),
        "{describe}"
    );
    assert!(
        describe.contains("public.refunds | table | id bigint not null")
            || describe.contains("public.refunds | table | id integer not null"),
        "{describe}"
    );
    assert!(describe.contains("PRIMARY KEY (id)"), "{describe}");
    assert!(
        describe.contains("FOREIGN KEY (order_id) REFERENCES orders(id)"),
        "{describe}"
    );

    let review = v["review"]["text"].as_str().expect("review text");
    eprintln!("review_changes:\n{review}");
    assert_eq!(v["review"]["is_error"], false, "{review}");
    // The DELETE of 10 refunds is what changed; the failed statement is in the summary.
    assert!(
        review.contains("1 table(s) with row changes (0 inserted, 0 updated, 10 deleted)"),
        "{review}"
    );
    assert!(review.contains("public.refunds"), "{review}");
    assert!(
        review.contains("42P01 select * from no_such_table"),
        "{review}"
    );

    let extra = v["extra_field"]["exception"].as_str().unwrap_or("");
    assert!(
        extra.contains("run_sql takes only \"sql\""),
        "{}",
        v["extra_field"]
    );
}

#[test]
fn python_sdk_over_stdio() {
    let g = harness::shared();
    let t = g.issue("mcp-stdio", 600);
    let dsn = t["dsn"].as_str().expect("dsn");
    let v = run_client(
        &["stdio", env!("CARGO_BIN_EXE_sandpit")],
        &[("SANDPIT_DSN", dsn), ("SANDPIT_API", &g.api)],
    );
    check_scenario(&v);
    // It went through the gateway: the statement log has the DELETE, as this token's.
    let (s, log) = g.raw_call(
        "GET",
        &format!("/v1/tokens/{}/statements", t["id"].as_str().unwrap_or("")),
        None,
    );
    assert_eq!(s, 200);
    assert!(
        log.to_string()
            .contains("delete from refunds where id <= 10"),
        "{log}"
    );
}

fn full_token(t: &Value) -> String {
    crate::support::wire::full_token(t["dsn"].as_str().expect("dsn"))
}

#[test]
fn python_sdk_over_streamable_http() {
    let g = harness::shared();
    let t = g.issue("mcp-http", 600);
    let url = format!("{}/mcp", g.api);
    let v = run_client(&["http", &url], &[("SANDPIT_TOKEN", &full_token(&t))]);
    check_scenario(&v);
}

fn post_mcp(url: &str, bearer: &str, body: Value) -> (u16, Option<Value>) {
    match harness::http("POST", url, Some(bearer), harness::Body::Json(body)) {
        Ok(r) => (r.status, serde_json::from_str(&r.body).ok()),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn http_edges_auth_versions_notifications_revoke() {
    let g = harness::shared();
    let t = g.issue("mcp-edges", 600);
    let tok = full_token(&t);
    let url = format!("{}/mcp", g.api);
    let init = |v: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": v, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    };

    // The older supported version is answered as asked.
    let (s, r) = post_mcp(&url, &tok, init("2025-03-26"));
    assert_eq!(s, 200);
    assert_eq!(r.expect("body")["result"]["protocolVersion"], "2025-03-26");

    // Notifications get 202 and no body.
    let (s, _) = post_mcp(
        &url,
        &tok,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(s, 202);

    // Unknown method, batch.
    let (s, r) = post_mcp(
        &url,
        &tok,
        json!([{"jsonrpc": "2.0", "id": 7, "method": "ping"},
               {"jsonrpc": "2.0", "id": 8, "method": "resources/list"}]),
    );
    assert_eq!(s, 200);
    let r = r.expect("batch");
    assert_eq!(r[0], json!({"jsonrpc": "2.0", "id": 7, "result": {}}));
    assert_eq!(r[1]["error"]["code"], -32601);

    // Wrong secret, no token, the admin key: all 401 before anything runs.
    let (id, _) = tok.split_once('.').expect("dot");
    for bad in [
        format!("{id}.wrongsecret"),
        String::new(),
        g.admin_key.clone(),
    ] {
        let (s, _) = post_mcp(&url, &bad, init("2025-06-18"));
        assert_eq!(s, 401, "bearer {bad:?}");
    }

    // GET is not offered.
    match harness::http("GET", &url, None, harness::Body::None) {
        Ok(r) if r.status == 405 => {}
        Ok(r) => panic!("GET /mcp: {} {}", r.status, r.body),
        Err(e) => panic!("GET /mcp: {e}"),
    }

    // A revoked token is refused.
    assert_eq!(g.revoke(id).0, 200);
    let (s, r) = post_mcp(&url, &tok, init("2025-06-18"));
    assert_eq!(s, 401, "{r:?}");
}

#[test]
fn stdio_raw_negotiation_and_revoke_mid_session() {
    let g = harness::shared();
    let t = g.issue("mcp-raw", 600);
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandpit"))
        .arg("mcp")
        .env("SANDPIT_DSN", t["dsn"].as_str().expect("dsn"))
        .env_remove("SANDPIT_API")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sandpit mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut send = |msg: &dyn std::fmt::Display| -> Value {
        writeln!(stdin, "{msg}").expect("write");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let r = send(&json!({"jsonrpc": "2.0", "id": "a", "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}));
    assert_eq!(r["id"], "a");
    assert_eq!(r["result"]["protocolVersion"], "2025-03-26");
    // Without an API URL there is no way to a review: the tool is not offered.
    let r = send(&json!({"jsonrpc": "2.0", "id": "l", "method": "tools/list"}));
    let names: Vec<_> = r["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["run_sql", "describe_schema"]);
    let r = send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_sql", "arguments": {"sql": "begin; create table t(x int); insert into t values (1), (NULL)"}}}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    // The session is kept between calls: the open transaction is still there.
    let r = send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "run_sql", "arguments": {"sql": "select x from t order by x; commit"}}}));
    assert_eq!(
        r["result"]["content"][0]["text"], "x\n1\nNULL\n(2 rows)\nOK, 0 rows affected\n",
        "{r}"
    );
    // Garbage gets a parse error with a null id, and the server goes on.
    let r = send(&"{not json");
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert_eq!(r["id"], Value::Null);
    let r = send(&json!({"jsonrpc": "2.0", "id": 4, "method": "ping"}));
    assert_eq!(r["id"], 4, "{r}");

    // Revoke: the next call is an error result with the gateway's SQLSTATE, not a crash.
    assert_eq!(g.revoke(t["id"].as_str().expect("id")).0, 200);
    let r = send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "run_sql", "arguments": {"sql": "select 1"}}}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    let text = r["result"]["content"][0]["text"].as_str().unwrap_or("");
    assert!(text.contains("57P01") || text.contains("28000"), "{text}");
    drop(stdin);
    let status = child.wait().expect("wait");
    assert!(status.success());
}

/// A `run_sql` call is bounded by the token's `max_bytes` as a whole: each result set is
/// capped by the gateway, and many statements, notices or a long error do not add up past it.
#[test]
fn run_sql_results_are_bounded_by_the_tokens_max_bytes() {
    let g = harness::shared();
    let t = g.issue_with(
        json!({"task": "mcp-bounded", "ttl_seconds": 600, "max_rows": 10, "max_bytes": 10_000}),
    );
    let tok = full_token(&t);
    let url = format!("{}/mcp", g.api);
    let call = |sql: String| {
        let (s, r) = post_mcp(
            &url,
            &tok,
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                   "params": {"name": "run_sql", "arguments": {"sql": sql}}}),
        );
        assert_eq!(s, 200);
        let r = r.expect("body");
        r["result"]["content"][0]["text"]
            .as_str()
            .expect("text")
            .to_string()
    };
    // 500 statements each returning a 1000-byte value: 500 kB before the bound.
    let text = call("select repeat('x', 1000) as v;".repeat(500));
    assert!(text.len() < 11_000, "{} bytes", text.len());
    assert!(
        text.contains("were not kept (max_bytes 10000)"),
        "{}",
        &text[text.len() - 300..]
    );
    // 100 000 notices from one DO loop.
    let text = call("do $$ begin for i in 1..100000 loop raise notice 'n %', repeat('y', 100); end loop; end $$".into());
    assert!(text.len() < 11_000, "{} bytes", text.len());
    // One error carrying a megabyte of detail.
    let text = call(
        "do $$ begin raise exception 'boom' using detail = repeat('d', 1000000); end $$".into(),
    );
    assert!(
        text.contains("boom") && text.len() < 11_000,
        "{} bytes",
        text.len()
    );
    // The session still works.
    assert!(call("select 41 + 1 as n".into()).contains("42"));
}
