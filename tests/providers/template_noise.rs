//! Every byte to the client counts on `template` too (issue 30, item 3): notices,
//! notifications and error fields count toward `max_bytes` like rows, and an MCP `run_sql`
//! result is bounded by the same caps, on a token whose scratch database lives in a shared
//! Postgres server (`tests/support/shared_pg.rs`) rather than a server of its own.

use crate::support::harness;
use crate::support::shared_pg;

use crate::support::harness::Gateway;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_postgres::{AsyncMessage, NoTls};

/// A gateway on the shared server; no scheduled janitor pass.
fn gateway(pg: &shared_pg::SharedPg) -> Gateway {
    let cfg = format!(
        "provider = \"template\"\n[template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\n\
         sslmode = \"require\"\n[janitor]\ninterval = \"0s\"\n",
        pg.admin_dsn()
    );
    Gateway::start(
        Some("create table items(id int primary key);\n"),
        Some(&cfg),
    )
}

/// What the client was sent while running `sql`: (notices, notifications, whether one notice
/// said what was dropped, the error's text and its bytes). The session answers `select 1`
/// afterwards or the test fails.
async fn sent(dsn: &str, listen: Option<&str>, sql: &str) -> (usize, usize, bool, Option<String>) {
    let (c, mut conn) = tokio_postgres::connect(dsn, NoTls).await.expect("connect");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            let _ = tx.send(m);
        }
    });
    if let Some(channel) = listen {
        c.batch_execute(&format!("listen {channel}"))
            .await
            .expect("listen");
    }
    let error = c.batch_execute(sql).await.err().map(|e| {
        let d = e.as_db_error().expect("a server error");
        format!(
            "{}\n{}\n{}",
            d.message(),
            d.detail().unwrap_or(""),
            d.hint().unwrap_or("")
        )
    });
    c.batch_execute("select 1")
        .await
        .expect("the session goes on");
    let (mut notices, mut notifications, mut summary) = (0, 0, false);
    while let Ok(m) = rx.try_recv() {
        match m {
            AsyncMessage::Notification(_) => notifications += 1,
            AsyncMessage::Notice(n) if n.message().contains("were not sent") => summary = true,
            AsyncMessage::Notice(_) => notices += 1,
            _ => {}
        }
    }
    (notices, notifications, summary, error)
}

#[test]
fn notices_notifications_errors_and_mcp_results_are_capped_on_template() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let g = gateway(&pg);
    let t: Value = g.issue_with(json!({
        "task": "template-noise", "ttl_seconds": 600, "max_rows": 10, "max_bytes": 10_000
    }));
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    rt.block_on(async {
        // 100 000 notices of ~160 bytes from one DO loop: about 16 MB from the server.
        let (notices, _, summary, error) = sent(
            &dsn,
            None,
            "do $$ begin for i in 1..100000 loop raise notice 'n % %', i, repeat('x', 150); end loop; end $$",
        )
        .await;
        assert_eq!(error, None);
        assert!((1..100).contains(&notices), "{notices} notices reached the client");
        assert!(summary, "no notice saying what was dropped");

        // pg_notify of 100 000 rows to the session that listens: delivered at commit, capped.
        let (_, notifications, summary, error) = sent(
            &dsn,
            Some("flood"),
            "select count(pg_notify('flood', repeat('y', 100) || g)) from generate_series(1, 100000) g",
        )
        .await;
        assert_eq!(error, None);
        assert!(notifications < 100, "{notifications} notifications reached the client");
        assert!(summary, "no notice saying what was dropped");

        // One error whose DETAIL and HINT carry a megabyte each: cut, with a marker.
        let (_, _, _, error) = sent(
            &dsn,
            None,
            "do $$ begin raise exception 'boom' using detail = repeat('d', 1000000), hint = repeat('h', 1000000); end $$",
        )
        .await;
        let error = error.expect("the exception reaches the client");
        assert!(error.contains("boom") && error.contains("more bytes cut]"), "{}", &error[..error.len().min(500)]);
        assert!(error.len() < 20_000, "{} bytes of error", error.len());
    });

    // MCP: one run_sql of 500 statements returning 1000 bytes each, bounded as a whole.
    let bearer = format!("{}.{}", t["id"].as_str().expect("id"), secret(&dsn));
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "run_sql", "arguments": {"sql": "select repeat('x', 1000) as v;".repeat(500)}}});
    let r = harness::http(
        "POST",
        &format!("{}/mcp", g.api),
        Some(&bearer),
        harness::Body::Json(body),
    )
    .expect("POST /mcp");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("json");
    let text = v["result"]["content"][0]["text"].as_str().expect("text");
    assert!(text.len() < 11_000, "{} bytes", text.len());
    assert!(
        text.contains("were not kept (max_bytes 10000)"),
        "{}",
        &text[text.len().saturating_sub(300)..]
    );
}

/// The secret in a token's DSN (`postgresql://<id>:<secret>@…`).
fn secret(dsn: &str) -> String {
    dsn.split("://")
        .nth(1)
        .and_then(|s| s.split('@').next())
        .and_then(|s| s.split(':').nth(1))
        .expect("secret in dsn")
        .to_string()
}
