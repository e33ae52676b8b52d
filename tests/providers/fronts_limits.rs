//! Per-token limits that hold across fronts sharing a registry and a shared directory (real
//! `sandpit serve` processes, the `tests/support/shared_pg.rs` server): a token's session
//! pace, its authentication failures and its statement log's quota are the fleet's, not each
//! front's. Also: the registry's pace statement agrees with the pure GCRA step, and a
//! registry that cannot count failures leaves each front limiting on its own.

use super::fronts::setup;
use crate::support::harness;
use crate::support::shared_pg;

use std::time::Duration;

use crate::support::harness::{connect, Gateway, SMALL_GOLDEN};
use sandpit::lifecycle::pace::{self, Turn};
use sandpit::pgconn::tls::SslMode;
use sandpit::registry::pool::PoolLimits;
use sandpit::registry::postgres::{PgRegistryConfig, PgStore};
use serde_json::Value;

fn whole(t: &Value) -> String {
    let id = t["id"].as_str().expect("id");
    let dsn = t["dsn"].as_str().expect("dsn");
    let secret = dsn
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .and_then(|(cred, _)| cred.split_once(':'))
        .map(|(_, s)| s.to_string())
        .expect("secret in dsn");
    format!("{id}.{secret}")
}

/// Logins of `pw`, `per_front` through each of the ports at once: (admitted, refused
/// with 53300). Anything else fails the test.
async fn flood(ports: [u16; 2], pw: &str, per_front: usize) -> (usize, usize) {
    let mut tasks = Vec::new();
    for i in 0..per_front * 2 {
        let (port, pw) = (ports[i % 2], pw.to_string());
        tasks.push(tokio::spawn(async move {
            harness::login_at(port, "agent", &pw).await
        }));
    }
    let (mut admitted, mut refused) = (0, 0);
    for t in tasks {
        match t.await.expect("login task") {
            Ok(1) => admitted += 1,
            Err((state, msg)) if state == "53300" => {
                assert!(msg.contains("sessions_per_second is 1"), "{msg}");
                refused += 1;
            }
            other => panic!("login: {other:?}"),
        }
    }
    (admitted, refused)
}

/// One token logging in at once through two fronts is paced as one: a burst of 3 and one a
/// second, waits of at most 2 s, so of 16 logins at once (8 per front, after one that
/// started its backend) 4 get in fleet-wide plus one per second the logins take to arrive.
/// Paced per front, at least 4 + 5 would get in however fast they came (at most 7 refused):
/// 8 refusals or more can only be the fleet's pace. Another token still has its whole burst.
#[test]
fn a_token_is_paced_as_one_across_fronts_and_another_token_is_not() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let limits = "[limits]\nsessions_per_second = 1\nsession_burst = 3\nstartup_timeout = \"2s\"\n";
    let (_pg, _shared, cfg) = setup(&rt, limits);
    let a = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let b = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    // Room for every login at once: only the pace refuses.
    let busy = a.issue_with(
        serde_json::json!({"task": "fronts-pace-busy", "ttl_seconds": 600, "max_connections": 20}),
    );
    let quiet = a.issue("fronts-pace-quiet", 600);
    let ports = [a.pg_port, b.pg_port];
    rt.block_on(async {
        assert_eq!(
            harness::login_at(a.pg_port, "agent", &whole(&busy)).await,
            Ok(1)
        );
        let (admitted, refused) = flood(ports, &whole(&busy), 8).await;
        assert_eq!(admitted + refused, 16);
        assert!(admitted >= 1, "a login over the pace waits its turn");
        assert!(
            refused >= 8,
            "paced as one token: {admitted} admitted, {refused} refused"
        );
        // The other token: its burst of 3, through both fronts, all straight in.
        let (admitted, refused) = flood(ports, &whole(&quiet), 1).await;
        assert_eq!((admitted, refused), (2, 0));
        assert_eq!(
            harness::login_at(b.pg_port, "agent", &whole(&quiet)).await,
            Ok(1)
        );
    });
}

fn limited(r: &Result<i32, (String, String)>) -> bool {
    matches!(r, Err((_, m)) if m.contains("too many authentication failures"))
}

/// Wrong secrets for one token, alternately through two fronts, are limited at the fleet's
/// count (5 a minute: the 6th failure is answered late and told so, not each front's 6th);
/// the right secret still gets in. With the registry's count gone (its table dropped), each
/// front limits on its own again: failures are never let through unlimited.
#[test]
fn auth_failures_are_counted_across_fronts_and_a_registry_failure_falls_back() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let (pg, _shared, cfg) = setup(&rt, "[limits]\nauth_failures_per_minute = 5\n");
    let a = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let b = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let t = a.issue("fronts-auth", 600);
    let other = a.issue("fronts-auth-fallback", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let wrong = "C".repeat(43);
    rt.block_on(async {
        let mut seen = Vec::new();
        for i in 0..8 {
            let port = if i % 2 == 0 { a.pg_port } else { b.pg_port };
            let r = harness::login_at(port, &id, &wrong).await;
            assert!(r.is_err(), "attempt {i}: {r:?}");
            seen.push(limited(&r));
        }
        assert_eq!(
            seen,
            [false, false, false, false, false, true, true, true],
            "limited from the fleet's 6th failure"
        );
        assert_eq!(
            harness::login_at(b.pg_port, "agent", &whole(&t)).await,
            Ok(1)
        );

        // The registry can no longer count: each front's own count decides.
        pg.admin("sandpit_registry")
            .await
            .batch_execute("DROP TABLE sandpit_auth_failures")
            .await
            .expect("drop the failure table");
        let oid = other["id"].as_str().expect("id").to_string();
        let mut seen = Vec::new();
        for i in 0..6 {
            seen.push(limited(&harness::login_at(a.pg_port, &oid, &wrong).await));
            assert!(i < 5 || seen[i], "attempt {i} on one front: {seen:?}");
        }
        assert_eq!(seen, [false, false, false, false, false, true]);
    });
    let m = harness::metrics(&a.api);
    let errors = m
        .iter()
        .find(|(k, _)| k.starts_with("sandpit_registry_limit_errors_total{limit=\"auth\""))
        .map(|(_, v)| *v)
        .unwrap_or(0.0);
    assert!(errors >= 6.0, "registry errors counted: {errors}");
}

/// A token's log quota counts both fronts' files: statements through both fronts together
/// are refused (58030) once the sum passes the quota, while each file holds well under it.
#[test]
fn the_log_quota_counts_every_fronts_file() {
    const QUOTA: u64 = 64 * 1024;
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let extra = format!("[log]\nmax_bytes_per_token = {QUOTA}\n");
    let (_pg, shared, cfg) = setup(&rt, &extra);
    let a = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let b = Gateway::start(Some(SMALL_GOLDEN), Some(&cfg));
    let task = "fronts-quota";
    let t = a.issue(task, 600);
    let id = t["id"].as_str().expect("id").to_string();
    let filler = "x".repeat(1000);
    let refused_at = rt.block_on(async {
        let ca = connect(&harness::redial(&t, &a)).await.expect("on A");
        let cb = connect(&harness::redial(&t, &b)).await.expect("on B");
        for i in 0..200 {
            let c = if i % 2 == 0 { &ca } else { &cb };
            let sql = format!("select '{filler}' as n{i}");
            if let Err(e) = c.simple_query(&sql).await {
                assert_eq!(harness::sqlstate(&e), "58030", "{e:?}");
                return i;
            }
        }
        panic!("200 statements of 1 kB each never reached a 64 KiB quota");
    });
    let dir = shared.path().join("logs").join(task).join(&id);
    // A busy front's file may end in its mapping's reserved zeros: its data is what counts.
    let sizes: Vec<u64> = std::fs::read_dir(&dir)
        .expect("the token's front files")
        .map(|e| {
            let bytes = std::fs::read(e.expect("entry").path()).expect("read");
            bytes
                .iter()
                .rposition(|&b| b != 0)
                .map_or(0, |i| i as u64 + 1)
        })
        .collect();
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    let total: u64 = sizes.iter().sum();
    // Refused near the sum's quota: each file is about half of it, not the whole.
    assert!(refused_at < 100, "refused after {refused_at} statements");
    for s in &sizes {
        assert!(*s < QUOTA * 3 / 4, "one file {s} of {sizes:?}");
    }
    // Overshoot bound: a chunk (1/64 of the quota) per front, plus a record.
    assert!(
        total <= QUOTA + 2 * (QUOTA / 64) + 2048,
        "{total} of {sizes:?}"
    );
    assert!(total > QUOTA * 3 / 4, "{total} of {sizes:?}");
}

fn store_config(pg: &shared_pg::SharedPg, url: &str) -> PgRegistryConfig {
    PgRegistryConfig {
        url: url.to_string(),
        sslmode: Some(SslMode::VerifyFull),
        ca_file: Some(pg.ca_file.clone()),
        pool: PoolLimits::default(),
    }
}

/// The registry's pace statement and the pure step agree, step by step, on one token's
/// logins at chosen instants of the statement's clock.
#[test]
fn the_registry_pace_statement_agrees_with_the_pure_step() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(shared_pg::SharedPg::start());
    let url = rt.block_on(pg.registry_database());
    rt.block_on(async {
        let store = PgStore::open(&store_config(&pg, &url)).await.expect("open");
        store.limits_schema().await.expect("schema");
        let t0 = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .expect("t0");
        let ms = Duration::from_millis;
        for (rate, burst, max_wait) in [(10, 3, 250), (2, 0, 600), (1, 5, 0), (0, 1, 0)] {
            let token = format!("sp_agree_{rate}_{burst}_{max_wait}");
            let (interval, tolerance) = pace::params(rate, burst);
            let mut tat = None;
            for at in [
                0, 0, 0, 0, 0, 0, 50, 50, 400, 1000, 1000, 1000, 1000, 1700, 5000,
            ] {
                let now = ms(at);
                let (want, next) = pace::step(tat, now, interval, tolerance, ms(max_wait));
                tat = next;
                if interval.is_zero() {
                    assert_eq!(want, Turn::Now);
                    continue;
                }
                let got = store
                    .pace_admit_at(&token, interval, tolerance, ms(max_wait), Some(t0 + now))
                    .await
                    .expect("pace statement");
                assert_eq!(Turn::from_wait(got), want, "{token} at {at} ms");
            }
        }
        // Failures of one key: the 4th (limit 3) onwards is over, within one minute.
        let over: Vec<bool> = {
            let mut v = Vec::new();
            for s in [0, 1, 2, 3, 4] {
                let at = t0 + Duration::from_secs(s);
                v.push(
                    store
                        .auth_failed_at("token:sp_k", 3, Some(at))
                        .await
                        .expect("count"),
                );
            }
            v
        };
        assert_eq!(over, [false, false, false, true, true]);
        // Three minutes on: the window is empty again.
        let later = t0 + Duration::from_secs(180);
        assert!(!store
            .auth_failed_at("token:sp_k", 3, Some(later))
            .await
            .expect("count"));
    });
}
