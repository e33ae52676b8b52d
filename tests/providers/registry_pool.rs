//! A front's registry connections are bounded (`registry.max_connections`): a burst of API
//! calls shares that many connections instead of opening one per call, and when every one
//! stays busy past `registry.acquire_timeout` the call is answered 503 with `Retry-After`,
//! naming the setting, and the gateway serves again once the registry frees up. The registry
//! is a real Postgres server (tests/support/shared_pg.rs); busy is made real by holding a lock
//! on the tokens table from the test, so the gateway's queries wait on the server.

use crate::support::harness::{http, Body, Gateway, SMALL_GOLDEN};
use crate::support::shared_pg;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MAX: i64 = 2;

fn config(pg: &shared_pg::SharedPg, registry_url: &str) -> String {
    format!(
        "provider = \"template\"\n\
         [template]\nadmin_dsn = \"{}\"\ngolden = \"sandpit_golden\"\nsslmode = \"require\"\n\
         [registry]\nurl = \"{registry_url}\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\n\
         max_connections = {MAX}\nacquire_timeout = \"1s\"\n",
        pg.admin_dsn(),
        pg.ca_file.display()
    )
}

/// The gateway's registry connections open now, and how many of them wait on a lock.
async fn registry_conns(admin: &tokio_postgres::Client) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock') \
             FROM pg_stat_activity WHERE application_name = 'sandpit-registry'",
            &[],
        )
        .await
        .expect("pg_stat_activity");
    (row.get(0), row.get(1))
}

fn issue(g: &Gateway, task: &str) -> (u16, String, Option<String>) {
    let r = http(
        "POST",
        &format!("{}/v1/tokens", g.api),
        Some(&g.admin_key),
        Body::Json(serde_json::json!({"task": task, "ttl_seconds": 600})),
    )
    .expect("an answer");
    let retry = r
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (r.status, r.body, retry)
}

#[test]
fn a_burst_shares_the_bounded_registry_connections_and_busy_is_a_clear_503() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let registry_url = rt.block_on(pg.registry_database());
    let g = Gateway::start(Some(SMALL_GOLDEN), Some(&config(&pg, &registry_url)));
    let admin = rt.block_on(pg.admin("postgres"));

    // 1. A burst of 40 issues from 8 threads, the registry's connections sampled meanwhile.
    let peak = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        let admin = rt.block_on(pg.admin("postgres"));
        rt.spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let (n, _) = registry_conns(&admin).await;
                peak.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    std::thread::scope(|s| {
        for t in 0..8 {
            let g = &g;
            s.spawn(move || {
                for i in 0..5 {
                    let (status, body, _) = issue(g, &format!("burst-{t}-{i}"));
                    assert_eq!(status, 201, "{body}");
                }
            });
        }
    });
    done.store(true, Ordering::Relaxed);
    rt.block_on(sampler).expect("sampler");
    // Queries hold at most MAX; beside them the change listener, and a janitor pass's lock.
    let peak = peak.load(Ordering::Relaxed);
    assert!(peak >= 1, "the sampler saw no registry connection");
    assert!(
        peak <= MAX + 2,
        "{peak} registry connections open at once (max_connections = {MAX})"
    );

    // 2. The tokens table locked by the test: the gateway's queries wait on the server, every
    // slot fills, and a call past them is told the registry is busy.
    let mut locker = rt.block_on(pg.admin(registry_db(&registry_url)));
    let tx = rt.block_on(locker.transaction()).expect("begin");
    rt.block_on(tx.batch_execute("LOCK TABLE sandpit_tokens IN ACCESS EXCLUSIVE MODE"))
        .expect("lock");
    let answers = std::thread::scope(|s| {
        let waiting: Vec<_> = (0..MAX)
            .map(|i| {
                let g = &g;
                s.spawn(move || issue(g, &format!("blocked-{i}")))
            })
            .collect();
        let filled = rt.block_on(async {
            for _ in 0..600 {
                if registry_conns(&admin).await.1 >= MAX {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        });
        assert!(
            filled,
            "the gateway's registry queries never all waited on the lock"
        );
        let (status, body, retry) = issue(&g, "past-the-limit");
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("registry.max_connections"), "{body}");
        assert_eq!(retry.as_deref(), Some("1"));
        rt.block_on(tx.rollback()).expect("unlock");
        waiting
            .into_iter()
            .map(|h| h.join().expect("issuer"))
            .collect::<Vec<_>>()
    });
    // Each call that was waiting either got its slot (and its insert ran once the lock went)
    // or was told busy; none is lost or answered otherwise.
    for (status, body, _) in &answers {
        assert!(*status == 201 || *status == 503, "{status} {body}");
    }
    // 3. Serving again once the registry frees up.
    let (status, body, _) = issue(&g, "after");
    assert_eq!(status, 201, "{body}");
    assert!(
        g.log().contains("the token registry is busy"),
        "busy not logged"
    );
}

/// The database name at the end of a registry URL.
fn registry_db(url: &str) -> &str {
    url.rsplit('/')
        .next()
        .and_then(|s| s.split('?').next())
        .unwrap_or("sandpit_registry")
}
