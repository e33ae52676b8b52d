//! Two fronts sharing a registry over two real workers (docs/workers.md): the workers' room
//! is reported into the registry's `sandpit_workers` (asked by the fronts on the workers'
//! behalf) and both fronts place from it; a worker killed and started again within
//! `remote.worker_lost_after` keeps its token; a worker killed for good is declared lost
//! once, its token is ended (revoked with the reason, which a client connecting with it and
//! `token show` see), the other worker's tokens keep working and a new token lands there.

use std::time::Duration;

use serde_json::{json, Value};

use super::worker::{client, dsn, id, tokens_on, with_slash, Worker, KEY};
use crate::support::harness::{connect, metrics, sqlstate, tempdir, wait_until, Gateway};
use crate::support::shared_pg::SharedPg;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn drain(http: &reqwest::blocking::Client, w: &Worker, draining: bool) {
    let r = http
        .post(format!("{}v1/drain", with_slash(&w.url)))
        .bearer_auth(KEY)
        .json(&json!({ "draining": draining }))
        .send()
        .expect("drain");
    assert_eq!(r.status(), 200);
}

/// `sandpit_workers` rows: (url, reports, max_sandboxes, sandboxes, draining, report age s,
/// lost).
type Row = (
    String,
    Option<bool>,
    Option<i64>,
    Option<i64>,
    Option<bool>,
    Option<f64>,
    bool,
);

fn rows(rt: &tokio::runtime::Runtime, pg: &SharedPg) -> Vec<Row> {
    rt.block_on(async {
        let c = pg.admin("sandpit_registry").await;
        c.query(
            "SELECT url, reports, max_sandboxes, sandboxes, draining, \
               extract(epoch from now() - reported_at)::float8, lost_at IS NOT NULL \
             FROM sandpit_workers ORDER BY url",
            &[],
        )
        .await
        .expect("workers table")
        .into_iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        })
        .collect()
    })
}

fn row<'a>(all: &'a [Row], w: &Worker) -> &'a Row {
    all.iter().find(|r| r.0 == w.url).expect("a row per worker")
}

fn lost_total(fronts: &[&Gateway]) -> f64 {
    fronts
        .iter()
        .map(|f| {
            metrics(&f.api)
                .get("sandpit_workers_lost_total")
                .copied()
                .unwrap_or(0.0)
        })
        .sum()
}

#[test]
fn fronts_place_from_the_registry_and_a_lost_workers_tokens_end() {
    let tmp = tempdir();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(SharedPg::start());
    let registry_url = rt.block_on(pg.registry_database());
    let (l0, l1) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let (d0, d1) = (tmp.path().join("w0"), tmp.path().join("w1"));
    let extra = "max_sandboxes = 6\n";
    let mut w0 = Worker::start_with(&d0, &l0, extra);
    let mut w1 = Worker::start_with(&d1, &l1, extra);
    let ca = tmp.path().join("workers-ca.pem");
    let mut bundle = std::fs::read(d0.join("tls/cert.pem")).expect("w0 cert");
    bundle.extend(std::fs::read(d1.join("tls/cert.pem")).expect("w1 cert"));
    std::fs::write(&ca, bundle).expect("bundle");
    let http = client(&ca);
    let cfg = format!(
        "provider = \"remote\"\n[remote]\nurls = [\"{}\", \"{}\"]\napi_key = \"{KEY}\"\n\
         golden = \"small\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\nretries = 0\n\
         connect_timeout = \"2s\"\nrequest_timeout = \"15s\"\nfork_timeout = \"60s\"\n\
         worker_lost_after = \"20s\"\n\
         [registry]\nurl = \"{registry_url}\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\n\
         refresh_interval = \"1s\"\n",
        w0.url,
        w1.url,
        ca.display(),
        pg.ca_file.display()
    );
    let mut a = Gateway::start(None, Some(&cfg));
    let mut b = Gateway::start(None, Some(&cfg));
    let use_it = |t: &Value, sql: &str| {
        rt.block_on(async {
            let c = connect(&dsn(t)).await?;
            c.simple_query(sql).await.map(|_| ())
        })
    };

    // The fronts report both workers' room into the registry, fresh.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let all = rows(&rt, &pg);
            all.len() == 2
                && all
                    .iter()
                    .all(|r| r.1 == Some(true) && r.2 == Some(6) && r.5.is_some_and(|a| a < 5.0))
        }),
        "{:?}\n{}",
        rows(&rt, &pg),
        a.log_problems()
    );

    // Worker 1 drains (the registry learns it): front A's token goes to worker 0, and is
    // counted in worker 0's row at once.
    drain(&http, &w1, true);
    assert!(
        wait_until(Duration::from_secs(10), || row(&rows(&rt, &pg), &w1).4
            == Some(true)),
        "{:?}",
        rows(&rt, &pg)
    );
    let t1 = a.issue("loss-1", 600);
    use_it(&t1, "create table kept(x int); insert into kept values (1)")
        .unwrap_or_else(|e| panic!("t1: {e}\n{}", a.log_problems()));
    assert_eq!(tokens_on(&http, &w0), vec![id(&t1)]);
    assert!(row(&rows(&rt, &pg), &w0).3.is_some_and(|n| n >= 1));
    // Then worker 0 drains and worker 1 takes forks again: front B's token goes to worker 1.
    drain(&http, &w1, false);
    drain(&http, &w0, true);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let all = rows(&rt, &pg);
            row(&all, &w0).4 == Some(true) && row(&all, &w1).4 == Some(false)
        }),
        "{:?}",
        rows(&rt, &pg)
    );
    let t2 = b.issue("loss-2", 600);
    use_it(&t2, "select 1").unwrap_or_else(|e| panic!("t2: {e}\n{}", b.log_problems()));
    assert_eq!(tokens_on(&http, &w1), vec![id(&t2)]);
    drain(&http, &w0, false);

    // Worker 0 is killed and back within the grace: it adopts its sandbox, t1 keeps working.
    w0.kill();
    std::thread::sleep(Duration::from_secs(3));
    let mut w0 = Worker::start_with(&d0, &l0, extra);
    assert!(w0.log().contains("sandbox adopted"), "{}", w0.log());
    use_it(&t1, "select x from kept").unwrap_or_else(|e| panic!("t1 after restart: {e}"));

    // Worker 1 is killed for good: past the grace it is lost, once, and t2 ends.
    w1.kill();
    let ended = || a.show(&id(&t2))["state"] == "revoked";
    assert!(
        wait_until(Duration::from_secs(90), ended),
        "{}\n{}\n{}",
        a.show(&id(&t2)),
        a.log_problems(),
        b.log_problems()
    );
    let shown = b.show(&id(&t2));
    assert_eq!(
        shown["ended_why"], "the worker holding its scratch database was lost",
        "{shown}"
    );
    assert!(
        shown["review"]
            .as_str()
            .is_some_and(|r| r.starts_with("failed: not made")),
        "{shown}"
    );
    let e = use_it(&t2, "select 1").expect_err("t2 ended");
    assert_eq!(sqlstate(&e), "28000", "{e:?}");
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(msg.contains("revoked") && msg.contains("worker"), "{msg}");
    assert!(row(&rows(&rt, &pg), &w1).6, "{:?}", rows(&rt, &pg));
    assert!(!row(&rows(&rt, &pg), &w0).6, "{:?}", rows(&rt, &pg));
    assert_eq!(lost_total(&[&a, &b]), 1.0);
    let declared = |g: &Gateway| g.log().matches("worker lost:").count();
    assert_eq!(declared(&a) + declared(&b), 1);

    // Worker 0's token is untouched, and a new token lands there.
    assert_eq!(a.show(&id(&t1))["state"], "live");
    use_it(&t1, "select x from kept").expect("t1 keeps working");
    let t3 = b.issue("loss-3", 600);
    use_it(&t3, "select 3").unwrap_or_else(|e| panic!("t3: {e}\n{}", b.log_problems()));
    assert!(tokens_on(&http, &w0).contains(&id(&t3)));

    a.stop();
    b.stop();
    w0.stop();
}
