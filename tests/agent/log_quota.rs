//! The statement log's quota, its cut of long text, and paged readers, through the real
//! gateway: a token that fills its log gets its statements refused (58030) and none of them
//! runs; a long text is stored cut with its length and SHA-256; `/statements` and
//! `sandpit log` page through a log.

use crate::support::harness;

use crate::support::harness::{connect, sqlstate, Gateway, SMALL_GOLDEN};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Small enough to fill in a few dozen statements.
const QUOTA: u64 = 2_000_000;

fn gateway() -> &'static Gateway {
    harness::process_gateway(|| {
        Gateway::start(
            Some(SMALL_GOLDEN),
            Some(&format!("[log]\nmax_bytes_per_token = {QUOTA}\n")),
        )
    })
}

fn dsn(t: &Value) -> String {
    t["dsn"].as_str().expect("dsn").to_string()
}

fn id(t: &Value) -> String {
    t["id"].as_str().expect("id").to_string()
}

/// One page of `/statements` and its `Sandpit-Next-After` header.
fn page(g: &Gateway, id: &str, query: &str) -> (u16, Value, Option<u64>) {
    let url = format!("{}/v1/tokens/{id}/statements{query}", g.api);
    match harness::http("GET", &url, Some(&g.admin_key), harness::Body::None) {
        // A refusal (4xx/5xx) may carry no JSON and is read without the paging header.
        Ok(r) if r.status < 400 => {
            let next = r
                .headers
                .get("sandpit-next-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            (r.status, serde_json::from_str(&r.body).expect("json"), next)
        }
        Ok(r) => (
            r.status,
            serde_json::from_str(&r.body).unwrap_or(Value::Null),
            None,
        ),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_log_refuses_statements_and_none_of_them_runs() {
    let g = gateway();
    let t = g.issue("log-quota", 600);
    let c = connect(&dsn(&t)).await.expect("connect");
    c.simple_query("insert into items values (5000, 'before the quota')")
        .await
        .expect("logged insert");

    // Fill the log: big statements first, then small ones, until even a small one is refused.
    let pad = "x".repeat(40_000);
    let mut refused = 0;
    for i in 0..200 {
        match c.simple_query(&format!("select {i} -- {pad}")).await {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(sqlstate(&e), "58030", "{e}");
                refused += 1;
                break;
            }
        }
    }
    assert_eq!(refused, 1, "the quota was never reached");
    let mut small_refused = false;
    for _ in 0..2000 {
        if let Err(e) = c.simple_query("select 1").await {
            assert_eq!(sqlstate(&e), "58030", "{e}");
            small_refused = true;
            break;
        }
    }
    assert!(small_refused);

    // A write now is refused before it runs, by every route; the session goes on.
    let e = c
        .simple_query("insert into items values (5001, 'over the quota')")
        .await
        .expect_err("refused");
    assert_eq!(sqlstate(&e), "58030", "{e}");
    let e = c
        .execute("insert into items values ($1, 'extended')", &[&5002i32])
        .await
        .expect_err("refused");
    assert_eq!(sqlstate(&e), "58030", "{e}");
    assert!(!c.is_closed(), "the session ended");
    let e = c.simple_query("select 2").await.expect_err("still full");
    assert_eq!(sqlstate(&e), "58030", "{e}");

    // The review reads the database itself, not through the log: only the logged insert ran.
    let (s, review) = g.raw_call("GET", &format!("/v1/tokens/{}/diff", id(&t)), None);
    assert_eq!(s, 200, "{review}");
    let items = review["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|d| d["table"].as_str().is_some_and(|n| n.contains("items")))
        .cloned()
        .expect("items changed");
    assert_eq!(items["inserted"], 1, "{items}");

    // The file stays within the quota but for outcome records; every line is a record.
    let log = g
        .data_dir
        .join("logs/log-quota")
        .join(format!("{}.jsonl", id(&t)));
    let raw = std::fs::read(&log).expect("log");
    // A busy log copied into a mapping of its file (src/journal/log/mapped.rs) ends in its
    // reserved tail of zeros until it goes idle: not records.
    let len = raw.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    assert!(len as u64 <= QUOTA + 4096, "{len} bytes");
    assert_eq!(
        sandpit::journal::log::unreadable_lines(&log).expect("check"),
        Vec::<u64>::new()
    );
    assert!(!raw.windows(14).any(|w| w == b"over the quota"));
    let m = harness::metrics(&g.api);
    assert!(
        m.get("sandpit_log_quota_exceeded_total")
            .copied()
            .unwrap_or(0.0)
            >= 4.0,
        "{m:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_text_is_stored_cut_with_its_length_and_digest() {
    let g = gateway();
    let t = g.issue("log-long-text", 600);
    let c = connect(&dsn(&t)).await.expect("connect");
    let text = format!("select 'é' -- {}", "z".repeat(100_000));
    c.simple_query(&text).await.expect("runs");
    let (s, v, next) = page(g, &id(&t), "");
    assert_eq!((s, next), (200, None), "{v}");
    let rec = v
        .as_array()
        .expect("array")
        .iter()
        .find(|r| {
            r["text"]
                .as_str()
                .is_some_and(|x| x.starts_with("select 'é'"))
        })
        .cloned()
        .expect("logged");
    let stored = rec["text"].as_str().expect("text");
    assert!(stored.len() <= 64 * 1024 && stored.len() > 60 * 1024);
    assert!(text.starts_with(stored));
    assert_eq!(rec["text_len"], text.len() as u64);
    assert_eq!(
        rec["text_sha256"],
        hex::encode(Sha256::digest(text.as_bytes()))
    );
    assert_eq!(rec["outcome"]["tag"], "SELECT 1", "{rec}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_are_read_a_page_at_a_time() {
    let g = gateway();
    let t = g.issue("log-pages", 600);
    let tid = id(&t);
    let c = connect(&dsn(&t)).await.expect("connect");
    let n = 2500u64;
    for i in 1..=n {
        c.simple_query(&format!("select {i}"))
            .await
            .expect("select");
    }

    // Bad bounds are refused.
    for q in ["?limit=0", "?limit=10001", "?after=x"] {
        assert_eq!(page(g, &tid, q).0, 400, "{q}");
    }

    // Without parameters: the first 1000, and where the next page starts.
    let (s, first, next) = page(g, &tid, "");
    assert_eq!(s, 200);
    let first = first.as_array().expect("array").clone();
    assert_eq!(first.len(), 1000);
    let seqs = |v: &[Value]| {
        v.iter()
            .map(|r| r["seq"].as_u64().expect("seq"))
            .collect::<Vec<_>>()
    };
    assert_eq!(next, seqs(&first).last().copied());

    // Paging through gives every statement once, in order, each with its outcome.
    let mut all = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let (s, v, next) = page(g, &tid, &format!("?after={after}&limit=700"));
        assert_eq!(s, 200);
        let v = v.as_array().expect("array").clone();
        assert!(v.len() <= 700);
        pages += 1;
        all.extend(v);
        match next {
            Some(a) => after = a,
            None => break,
        }
    }
    assert_eq!(pages, 4);
    let texts: Vec<String> = all
        .iter()
        .map(|r| r["text"].as_str().expect("text").to_string())
        .collect();
    let expect: Vec<String> = (1..=n).map(|i| format!("select {i}")).collect();
    assert_eq!(texts, expect);
    assert!(seqs(&all).windows(2).all(|w| w[0] < w[1]));
    assert!(all.iter().all(|r| r["outcome"]["tag"] == "SELECT 1"));

    // A page from the middle starts right after `after`.
    let mid = seqs(&all)[1233];
    let (_, v, _) = page(g, &tid, &format!("?after={mid}&limit=2"));
    assert_eq!(v[0]["text"], "select 1235");
    assert_eq!(v[1]["text"], "select 1236");

    // `sandpit log` pages through the whole log.
    let (code, out, err) = harness::run_sandpit(
        &["log", &tid, "--json", "--api", &g.api],
        &[("SANDPIT_ADMIN_KEY", &g.admin_key)],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len() as u64, n);
    assert_eq!(lines.last().expect("last")["text"], format!("select {n}"));
}

/// No cliff without notice: before its log is full, each session of the token is told (a
/// WARNING, once per level) at 80 % and 95 % of the quota, and the gateway counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filling_log_warns_its_sessions_at_80_and_95_percent() {
    use futures_util::StreamExt;
    let g = gateway();
    let t = g.issue("log-fill", 600);
    let (c, mut conn) = tokio_postgres::connect(&dsn(&t), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            let _ = tx.send(m);
        }
    });
    let pad = "y".repeat(40_000);
    let mut warnings = Vec::new();
    let mut refused = false;
    for i in 0..200 {
        if let Err(e) = c.simple_query(&format!("select {i} -- {pad}")).await {
            assert_eq!(sqlstate(&e), "58030", "{e}");
            refused = true;
            break;
        }
        while let Ok(m) = rx.try_recv() {
            if let tokio_postgres::AsyncMessage::Notice(n) = m {
                if n.message().contains("statement log is") {
                    assert_eq!(n.severity(), "WARNING");
                    warnings.push((i, n.message().to_string()));
                }
            }
        }
    }
    assert!(refused, "the quota was never reached");
    let levels: Vec<bool> = ["80% full", "95% full"]
        .iter()
        .map(|l| warnings.iter().filter(|(_, w)| w.contains(l)).count() == 1)
        .collect();
    assert_eq!(levels, [true, true], "{warnings:?}");
    assert!(
        warnings[0].0 < warnings[1].0,
        "80 % before 95 %: {warnings:?}"
    );
    let m = harness::metrics(&g.api);
    assert!(
        m.get("sandpit_log_fill_warnings_total")
            .copied()
            .unwrap_or(0.0)
            >= 2.0,
        "{:?}",
        m.get("sandpit_log_fill_warnings_total")
    );
}
