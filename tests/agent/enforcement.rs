//! Enforcement that cannot be talked around, tried as a hostile agent with raw protocol
//! messages: caps hold when the gateway cannot split the SQL, for FunctionCall and around
//! COPY FROM STDIN; the log shows the text the server ran even when a second Parse under the
//! same name tries to relabel it; and one token's worst message leaves others working.

use crate::support::harness;
use crate::support::wire;

use std::sync::OnceLock;

use crate::support::harness::{connect, Gateway};
use serde_json::{json, Value};
use wire::{rows_per_result, Raw};

const GOLDEN: &str = "create table items(id int primary key, name text not null);\n\
insert into items select g, 'item ' || g from generate_series(1, 1000) g;\n\
create table landing(x int);\n";

const CAP: usize = 200;

fn gw() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| harness::process_gateway(|| Gateway::start(Some(GOLDEN), None)))
}

/// `<id>.<secret>`, the cleartext password.
fn full_token(v: &Value) -> String {
    wire::full_token(v["dsn"].as_str().expect("dsn"))
}

fn issue(task: &str) -> Value {
    gw().issue_with(
        json!({"task": task, "ttl_seconds": 600, "max_rows": CAP, "max_bytes": 1_000_000}),
    )
}

fn login(t: &Value) -> Raw {
    Raw::login(gw().pg_port, &full_token(t))
}

fn statements(id: &str) -> Vec<Value> {
    let (s, v) = gw().raw_call("GET", &format!("/v1/tokens/{id}/statements"), None);
    assert_eq!(s, 200, "{v}");
    v.as_array().cloned().unwrap_or_default()
}

fn id(t: &Value) -> String {
    t["id"].as_str().expect("id").to_string()
}

#[test]
fn caps_hold_when_the_gateway_cannot_split_the_query() {
    let t = issue("unsplittable");
    let mut s = login(&t);
    let big = "SELECT g FROM generate_series(1, 100000) g";
    let many_then_big = format!("{}{big}", "SELECT 1;".repeat(1_001));
    let texts = [
        // Past the gateway's split bound: relayed whole.
        many_then_big.as_str(),
        // Texts the lexer has been fooled by before.
        "SELECT 'BEGIN ATOMIC' AS a; SELECT g FROM generate_series(1, 100000) g",
        "SELECT 1 AS a -- c\r; SELECT g FROM generate_series(1, 100000) g",
        "SELECT e'\\'' AS a; SELECT g FROM generate_series(1, 100000) g",
        "SELECT $x$ ; $x$ AS a; SELECT g FROM generate_series(1, 100000) g",
        "SELECT 1 AS \"e\"; SELECT g FROM generate_series(1, 100000) g",
    ];
    for text in texts {
        s.send(&wire::query(text));
        let msgs = s.until_ready();
        let per = rows_per_result(&msgs);
        let short = &text[..text.len().min(60)];
        assert!(
            per.iter().all(|&n| n <= CAP),
            "{short}: rows per result {:?}",
            &per[per.len().saturating_sub(3)..]
        );
        if !msgs.iter().any(|(t, _)| *t == b'E') {
            // The big result came back, cut at the cap, with the notice.
            assert_eq!(per.last(), Some(&CAP), "{short}");
            assert!(
                msgs.iter()
                    .any(|(t, b)| *t == b'N' && wire::field(b, b'M').contains("cut at 200")),
                "{short}: no cap notice"
            );
        }
    }
    // The whole text is in the log, and its outcome says it was capped.
    let log = statements(&id(&t));
    let rec = log
        .iter()
        .find(|r| r["text"].as_str() == Some(many_then_big.as_str()))
        .expect("the unsplit text is logged whole");
    assert_eq!(rec["outcome"]["capped"], true, "{rec}");
    s.send(&wire::query("SELECT 42"));
    let msgs = s.until_ready();
    assert!(msgs
        .iter()
        .any(|(t, b)| *t == b'D' && wire::first_column(b).as_deref() == Some("42")));
}

#[test]
fn function_call_results_are_capped_by_bytes_and_logged_with_arguments() {
    let t = issue("function-call");
    let mut s = login(&t);
    s.send(&wire::query(
        "SELECT 'repeat(text,integer)'::regprocedure::oid::int",
    ));
    let oid: u32 = s
        .until_ready()
        .iter()
        .find(|(t, _)| *t == b'D')
        .and_then(|(_, b)| wire::first_column(b))
        .and_then(|v| v.parse().ok())
        .expect("oid of repeat");
    // 2 MB result on a 1 MB byte cap: cut, with a notice, and the session goes on.
    s.send(&wire::function_call(oid, &["x", "2000000"]));
    let msgs = s.until_ready();
    let notice = msgs
        .iter()
        .find(|(t, _)| *t == b'N')
        .map(|(_, b)| wire::field(b, b'M'))
        .expect("cap notice");
    assert!(notice.contains("max_bytes"), "{notice}");
    let v = msgs
        .iter()
        .find(|(t, _)| *t == b'V')
        .expect("function result");
    assert_eq!(
        v.1,
        (-1i32).to_be_bytes().to_vec(),
        "result replaced by NULL"
    );
    let relayed: usize = msgs.iter().map(|(_, b)| b.len()).sum();
    assert!(relayed < 100_000, "{relayed} bytes relayed");
    // A small result passes untouched.
    s.send(&wire::function_call(oid, &["ab", "3"]));
    let msgs = s.until_ready();
    let v = msgs
        .iter()
        .find(|(t, _)| *t == b'V')
        .expect("function result");
    assert_eq!(&v.1[4..], b"ababab");
    let log = statements(&id(&t));
    let calls: Vec<&Value> = log.iter().filter(|r| r["protocol"] == "function").collect();
    assert_eq!(calls.len(), 2, "{log:#?}");
    assert_eq!(calls[0]["text"], format!("function call oid={oid}"));
    assert_eq!(calls[0]["params"], json!(["x", "2000000"]));
    assert_eq!(calls[0]["outcome"]["capped"], true, "{}", calls[0]);
    assert_eq!(calls[1]["outcome"]["capped"], false, "{}", calls[1]);
}

#[test]
fn syncs_inside_copy_from_stdin_leave_the_pipeline_in_step() {
    let t = issue("copy-in-syncs");
    let mut s = login(&t);
    // Simple protocol: three Syncs inside the COPY are ignored by the server.
    s.send(&wire::query("COPY landing FROM STDIN"));
    let (tag, _) = s.read().expect("CopyInResponse");
    assert_eq!(tag, b'G');
    for _ in 0..3 {
        s.send(&wire::sync());
    }
    s.send(&wire::msg(b'd', b"1\n2\n"));
    s.send(&wire::msg(b'c', &[]));
    let msgs = s.until_ready();
    assert!(msgs
        .iter()
        .any(|(t, b)| *t == b'C' && b.starts_with(b"COPY 2")));
    // Extended protocol, the way tokio-postgres's copy_in sends it: Sync before the data.
    s.send(&wire::parse("", "COPY landing FROM STDIN"));
    s.send(&wire::bind("", ""));
    s.send(&wire::execute("", 0));
    s.send(&wire::sync());
    s.send(&wire::sync());
    s.send(&wire::msg(b'd', b"3\n"));
    s.send(&wire::msg(b'c', &[]));
    s.send(&wire::sync());
    let msgs = s.until_ready();
    assert!(
        msgs.iter()
            .any(|(t, b)| *t == b'C' && b.starts_with(b"COPY 1")),
        "{:?}",
        msgs.iter().map(|m| m.0 as char).collect::<String>()
    );
    // Every statement after it is still counted against its own result and logged with
    // its own outcome.
    for _ in 0..3 {
        s.send(&wire::query("SELECT g FROM generate_series(1, 100000) g"));
        let msgs = s.until_ready();
        assert_eq!(rows_per_result(&msgs), vec![CAP]);
    }
    s.send(&wire::query("SELECT count(*) FROM landing"));
    let msgs = s.until_ready();
    let n = msgs
        .iter()
        .find(|(t, _)| *t == b'D')
        .and_then(|(_, b)| wire::first_column(b));
    assert_eq!(n.as_deref(), Some("3"));
    let log = statements(&id(&t));
    let capped: Vec<&Value> = log
        .iter()
        .filter(|r| r["text"] == "SELECT g FROM generate_series(1, 100000) g")
        .collect();
    assert_eq!(capped.len(), 3);
    for r in capped {
        assert_eq!(r["outcome"]["rows"], CAP, "{r}");
        assert_eq!(r["outcome"]["capped"], true, "{r}");
    }
    let count = log
        .iter()
        .find(|r| r["text"] == "SELECT count(*) FROM landing")
        .expect("count logged");
    assert_eq!(count["outcome"]["rows"], 1, "{count}");
}

#[test]
fn a_second_parse_under_the_same_name_cannot_relabel_the_log() {
    for pipelined in [false, true] {
        let t = issue("parse-twice");
        let mut s = login(&t);
        let write = "DELETE FROM items WHERE id <= 10";
        let steps = [
            [wire::parse("s1", write), wire::sync()].concat(),
            // Refused by the server: s1 exists.
            [wire::parse("s1", "SELECT 1"), wire::sync()].concat(),
            [wire::bind("", "s1"), wire::execute("", 0), wire::sync()].concat(),
        ];
        let mut codes = Vec::new();
        if pipelined {
            s.send(&steps.concat());
            for _ in 0..3 {
                codes.push(s.until_ready());
            }
        } else {
            for step in &steps {
                s.send(step);
                codes.push(s.until_ready());
            }
        }
        let err = codes[1]
            .iter()
            .find(|(t, _)| *t == b'E')
            .map(|(_, b)| wire::field(b, b'C'));
        assert_eq!(
            err.as_deref(),
            Some("42P05"),
            "duplicate prepared statement"
        );
        assert!(
            codes[2]
                .iter()
                .any(|(t, b)| *t == b'C' && b.starts_with(b"DELETE 10")),
            "the write ran"
        );
        let log = statements(&id(&t));
        let ran = log
            .iter()
            .find(|r| r["protocol"] == "extended" && r["outcome"]["tag"] == "DELETE 10")
            .unwrap_or_else(|| panic!("no logged extended DELETE: {log:#?}"));
        assert_eq!(ran["text"], write, "pipelined={pipelined}: {ran}");
        assert_eq!(ran["kind"], "write");
    }
}

#[test]
fn one_tokens_worst_message_leaves_other_tokens_working() {
    let hog = issue("hog");
    let mut s = login(&hog);
    let n = 50_000;
    s.send(&wire::query(&"SELECT 1;".repeat(n)));
    // While the hog's query runs (its response not read yet), another token logs in and
    // queries.
    let other = issue("bystander");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(other["dsn"].as_str().expect("dsn"))
            .await
            .expect("another token logs in");
        let v: i32 = c.query_one("select 1", &[]).await.expect("query").get(0);
        assert_eq!(v, 1);
    });
    let msgs = s.until_ready();
    let done = msgs.iter().filter(|(t, _)| *t == b'C').count();
    assert_eq!(done, n, "every statement completed");
    // The hog's session goes on, in step.
    s.send(&wire::query("SELECT 7"));
    let msgs = s.until_ready();
    assert_eq!(
        msgs.iter()
            .find(|(t, _)| *t == b'D')
            .and_then(|(_, b)| wire::first_column(b))
            .as_deref(),
        Some("7")
    );
}

#[test]
fn a_session_the_server_ends_gets_the_servers_reason_once() {
    let t = issue("terminated");
    let mut s = login(&t);
    s.send(&wire::query(
        "SELECT pg_terminate_backend(pg_backend_pid())",
    ));
    let mut errors = Vec::new();
    while let Some((tag, body)) = s.read() {
        if tag == b'E' {
            errors.push((wire::field(&body, b'V'), wire::field(&body, b'C')));
        }
    }
    assert_eq!(errors, vec![("FATAL".to_string(), "57P01".to_string())]);
}

#[test]
fn the_client_sees_the_real_backend_pid_and_only_the_gateways_secret_cancels() {
    let t = issue("backend-pid");
    let mut s = login(&t);
    let (pid, secret) = s.key.expect("BackendKeyData");
    s.send(&wire::query("SELECT pg_backend_pid()"));
    let real = s
        .until_ready()
        .iter()
        .find(|(t, _)| *t == b'D')
        .and_then(|(_, b)| wire::first_column(b))
        .expect("pid");
    assert_eq!(
        real,
        pid.to_string(),
        "PQbackendPID matches pg_backend_pid()"
    );
    let watcher = Raw::login(gw().pg_port, &full_token(&t));
    let mut watcher = watcher;
    let running = |w: &mut Raw| -> bool {
        w.send(&wire::query(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid} AND state = 'active'"
        )));
        w.until_ready()
            .iter()
            .find(|(t, _)| *t == b'D')
            .and_then(|(_, b)| wire::first_column(b))
            .as_deref()
            == Some("1")
    };
    s.send(&wire::query("SELECT pg_sleep(60)"));
    assert!(harness::wait_until(
        std::time::Duration::from_secs(30),
        || running(&mut watcher)
    ));
    // The right pid with a wrong secret does nothing.
    wire::cancel(gw().pg_port, (pid, secret.wrapping_add(1)));
    assert!(running(&mut watcher), "a wrong secret cancelled the query");
    wire::cancel(gw().pg_port, (pid, secret));
    let msgs = s.until_ready();
    let code = msgs
        .iter()
        .find(|(t, _)| *t == b'E')
        .map(|(_, b)| wire::field(b, b'C'));
    assert_eq!(code.as_deref(), Some("57014"));
}
