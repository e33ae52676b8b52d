//! A load test through one token on the default log quota (256 MiB): a million short
//! statements, pipelined through the real gateway to a real scratch Postgres, are all
//! answered (none refused for a full log) and all read back, each with its text and outcome,
//! from the compact statement log (docs/statement-log.md).
//! `SANDPIT_LOG_LOAD_STATEMENTS` sets another count (default 1,000,000).

use crate::support::harness;

use crate::support::harness::{connect, Gateway, SMALL_GOLDEN};
use futures_util::stream::{self, StreamExt};

const TEXTS: u64 = 10;

fn count() -> u64 {
    std::env::var("SANDPIT_LOG_LOAD_STATEMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

#[test]
fn a_million_statements_fit_the_default_quota_and_all_read_back() {
    let n = count();
    let tmp = harness::tempdir();
    // No [log] section: the default quota.
    let g = Gateway::start_in(tmp.path(), Some(SMALL_GOLDEN), None);
    let t = g.issue("log-load", 3600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let started = std::time::Instant::now();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = connect(&dsn).await.expect("connect");
        let c = &c;
        // Pipelined (tokio-postgres sends queued queries without waiting): the gateway
        // writes a statement record before forwarding each one.
        let answered = stream::iter(0..n)
            .map(|i| async move { c.simple_query(&format!("select {}", i % TEXTS)).await })
            .buffered(64)
            .fold(0u64, |k, r| async move {
                if let Err(e) = r {
                    panic!("statement {k} refused: {e}");
                }
                k + 1
            })
            .await;
        assert_eq!(answered, n);
    });
    let ran = started.elapsed();

    // Read back page by page (never all at once), in order.
    let read_started = std::time::Instant::now();
    let (mut seen, mut after, mut with_outcome) = (0u64, 0u64, 0u64);
    loop {
        let (s, v) = g.raw_call(
            "GET",
            &format!("/v1/tokens/{id}/statements?after={after}&limit=10000"),
            None,
        );
        assert_eq!(s, 200, "{v}");
        let page = v.as_array().cloned().unwrap_or_default();
        let Some(last) = page.last().and_then(|s| s["seq"].as_u64()) else {
            break;
        };
        for st in &page {
            assert_eq!(
                st["text"],
                format!("select {}", seen % TEXTS),
                "statement {seen}: {st}"
            );
            if st["outcome"]["tag"] == "SELECT 1" {
                with_outcome += 1;
            }
            seen += 1;
        }
        after = last;
    }
    assert_eq!(seen, n, "statements read back");
    // Outcomes are written after their statements: all there once the session went idle.
    assert_eq!(with_outcome, n, "outcomes read back");
    let path = tmp.path().join("logs/log-load").join(format!("{id}.jsonl"));
    let bytes = std::fs::read(&path)
        .expect("log")
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i + 1);
    println!(
        "{n} statements: run {:.1} s, read back {:.1} s, log {bytes} bytes ({:.1} per statement with its outcome)",
        ran.as_secs_f64(),
        read_started.elapsed().as_secs_f64(),
        bytes as f64 / n as f64
    );
}
