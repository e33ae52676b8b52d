//! Issue 32's fleet on one machine: two fronts (`remote` provider, one Postgres registry,
//! one `registry.shared_dir`) over three worker processes, each on its own data dir. 300
//! tokens are spread over the workers, each writes a row through the front that did not
//! issue it; one token's sessions go through both fronts and have one log; a front is killed
//! mid-session and its client goes on through the other; a worker is killed and adopts its
//! sandboxes when it comes back; every node is restarted in turn. Nothing acknowledged is
//! lost (every token reads its row at the end), and revoking every token leaves no scratch
//! server behind on any worker. Where network namespaces can be made (root; CI must have
//! them), each worker runs in one of its own, reached by the fronts over a veth link as if on
//! another machine; elsewhere the workers listen on loopback.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::worker::{client, id, tokens_on, Worker, KEY};
use crate::support::harness::{self, connect, processes_in, tempdir, wait_until, Gateway};
use crate::support::netns::Netns;
use crate::support::require;
use crate::support::shared_pg::SharedPg;

/// Tokens spread over the workers.
const TOKENS: usize = 300;
/// Threads issuing and first-connecting them.
const THREADS: usize = 12;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Runs `sql` as token `t` through front `g`; the first row's first column, if any.
fn run(
    rt: &tokio::runtime::Runtime,
    t: &Value,
    g: &Gateway,
    sql: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    rt.block_on(harness::query_one(&harness::redial(t, g), sql))
}

/// The token's statement texts as front `g` reads its one log.
fn log_texts(g: &Gateway, token: &str) -> Vec<String> {
    let (status, v) = g.raw_call(
        "GET",
        &format!("/v1/tokens/{token}/statements?limit=1000"),
        None,
    );
    assert_eq!(status, 200, "{v}");
    v.as_array()
        .expect("array")
        .iter()
        .filter_map(|s| s["text"].as_str().map(str::to_string))
        .collect()
}

/// Every token reads back the row it wrote, through `g`.
fn all_rows_read(rt: &tokio::runtime::Runtime, tokens: &[Value], g: &Gateway, when: &str) {
    for (i, t) in tokens.iter().enumerate() {
        let got = run(rt, t, g, "select x::text from mine")
            .unwrap_or_else(|e| panic!("{when}: token {i} ({}): {e}\n{}", id(t), g.log_problems()));
        assert_eq!(
            got.as_deref(),
            Some(i.to_string().as_str()),
            "{when}: token {i}"
        );
    }
}

struct Fleet {
    cfg: String,
    listens: Vec<String>,
    dirs: Vec<std::path::PathBuf>,
    /// A namespace per worker, when they can be made here.
    nets: Option<Vec<Netns>>,
}

impl Fleet {
    fn worker(&self, i: usize) -> Worker {
        let ns = self.nets.as_ref().map(|n| &n[i]);
        Worker::start_inside(ns, &self.dirs[i], &self.listens[i], "max_sandboxes = 130\n")
    }

    fn front(&self, dir: &Path) -> Gateway {
        std::fs::create_dir_all(dir).expect("front dir");
        Gateway::start_in(dir, None, Some(&self.cfg))
    }
}

#[test]
fn two_fronts_three_workers_300_tokens_kills_and_a_rolling_restart_lose_nothing() {
    let tmp = tempdir();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let pg = rt.block_on(SharedPg::start());
    let registry_url = rt.block_on(pg.registry_database());
    let nets = match (0..3).map(Netns::create).collect::<Result<Vec<_>, _>>() {
        Ok(nets) => Some(nets),
        Err(why) => {
            // Panics under CI; elsewhere the fleet runs on loopback.
            let _ = require::require(false, "network namespaces", &why);
            None
        }
    };
    let listens: Vec<String> = match &nets {
        // A namespace of its own: any port is free there, and stays so across restarts.
        Some(nets) => nets.iter().map(|n| format!("{}:7443", n.inside)).collect(),
        None => (0..3)
            .map(|_| format!("127.0.0.1:{}", free_port()))
            .collect(),
    };
    let dirs: Vec<_> = (0..3).map(|i| tmp.path().join(format!("w{i}"))).collect();
    let mut fleet = Fleet {
        cfg: String::new(),
        listens,
        dirs,
        nets,
    };
    let mut workers: Vec<Worker> = (0..3).map(|i| fleet.worker(i)).collect();
    if fleet.nets.is_some() {
        // Each worker is in a network namespace other than the fronts' (this process's).
        let here = std::fs::read_link("/proc/self/ns/net").expect("own netns");
        for w in &workers {
            let pid = w.pid().expect("running");
            let there = std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("worker netns");
            assert_ne!(
                here, there,
                "worker {pid} shares the fronts' network namespace"
            );
        }
    }
    let ca = tmp.path().join("workers-ca.pem");
    let mut bundle = Vec::new();
    for d in &fleet.dirs {
        bundle.extend(std::fs::read(d.join("tls/cert.pem")).expect("worker cert"));
    }
    std::fs::write(&ca, bundle).expect("bundle");
    let http = client(&ca);
    let shared = tmp.path().join("shared");
    std::fs::create_dir_all(&shared).expect("shared dir");
    let urls: Vec<String> = workers.iter().map(|w| format!("\"{}\"", w.url)).collect();
    fleet.cfg = format!(
        "provider = \"remote\"\n[remote]\nurls = [{}]\napi_key = \"{KEY}\"\n\
         golden = \"small\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\nretries = 2\n\
         connect_timeout = \"2s\"\nrequest_timeout = \"30s\"\nfork_timeout = \"120s\"\n\
         worker_lost_after = \"10m\"\n\
         [registry]\nurl = \"{registry_url}\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\n\
         refresh_interval = \"1s\"\nshared_dir = \"{}\"\n\
         [limits]\nsessions_per_second = 1000\nsession_burst = 1000\n",
        urls.join(", "),
        ca.display(),
        pg.ca_file.display(),
        shared.display()
    );
    let (da, db) = (tmp.path().join("front-a"), tmp.path().join("front-b"));
    let mut fronts = [fleet.front(&da), fleet.front(&db)];

    // 300 tokens, issued on one front, first connected through the other, each writing a row.
    let tokens: Vec<Value> = std::thread::scope(|s| {
        let fronts = &fronts;
        let handles: Vec<_> = (0..THREADS)
            .map(|k| {
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("rt");
                    (k..TOKENS)
                        .step_by(THREADS)
                        .map(|i| {
                            let t = fronts[i % 2].issue(&format!("fleet-{i}"), 3600);
                            let g = &fronts[(i + 1) % 2];
                            run(
                                &rt,
                                &t,
                                g,
                                &format!("create table mine(x int); insert into mine values ({i})"),
                            )
                            .unwrap_or_else(|e| panic!("token {i}: {e}\n{}", g.log_problems()));
                            (i, t)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, Value)> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("issuing thread"))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, t)| t).collect()
    });
    // Spread: every worker holds a share (placement by room, not all on one).
    let held: Vec<usize> = workers.iter().map(|w| tokens_on(&http, w).len()).collect();
    assert_eq!(held.iter().sum::<usize>(), TOKENS, "{held:?}");
    assert!(held.iter().all(|&n| n >= TOKENS / 6), "uneven: {held:?}");

    // One token through both fronts: one log, read the same from either.
    let t = &tokens[0];
    let tid = id(t);
    run(&rt, t, &fronts[0], "insert into mine values (1000)").expect("through A");
    run(&rt, t, &fronts[1], "insert into mine values (1001)").expect("through B");
    let from_a = log_texts(&fronts[0], &tid);
    assert_eq!(from_a, log_texts(&fronts[1], &tid));
    for s in [
        "insert into mine values (1000)",
        "insert into mine values (1001)",
    ] {
        assert!(from_a.iter().any(|x| x == s), "{s} missing: {from_a:?}");
    }
    run(&rt, t, &fronts[0], "delete from mine where x >= 1000").expect("back to one row");

    // Front A killed mid-session: the open session's acknowledged write stays, the client
    // goes on through B, and B's log of the token holds A's statement.
    let t1 = &tokens[1];
    let session = rt
        .block_on(connect(&harness::redial(t1, &fronts[0])))
        .expect("session on A");
    rt.block_on(session.batch_execute("insert into mine values (2000)"))
        .expect("acknowledged on A");
    fronts[0].kill();
    assert!(rt.block_on(session.simple_query("select 1")).is_err());
    assert_eq!(
        run(
            &rt,
            t1,
            &fronts[1],
            "select count(*)::text from mine where x = 2000"
        )
        .expect("through B")
        .as_deref(),
        Some("1")
    );
    assert!(log_texts(&fronts[1], &id(t1))
        .iter()
        .any(|x| x == "insert into mine values (2000)"));
    run(&rt, t1, &fronts[1], "delete from mine where x = 2000").expect("cleanup");
    fronts[0] = fleet.front(&da);

    // A worker killed and back on its data dir: it adopts its sandboxes.
    workers[2].kill();
    workers[2] = fleet.worker(2);
    assert!(
        workers[2].log().contains("sandbox adopted"),
        "{}",
        workers[2].log()
    );
    all_rows_read(&rt, &tokens, &fronts[0], "after a worker was killed");

    // Rolling restart: each front, then each worker, stopped and started in turn, with the
    // other nodes serving meanwhile.
    for f in 0..2 {
        fronts[f].stop();
        let other = &fronts[(f + 1) % 2];
        run(&rt, &tokens[2], other, "select 1").expect("the other front serves");
        fronts[f] = fleet.front(if f == 0 { &da } else { &db });
    }
    for (i, w) in workers.iter_mut().enumerate() {
        w.stop();
        *w = fleet.worker(i);
    }
    all_rows_read(&rt, &tokens, &fronts[1], "after the rolling restart");

    // Token 0 revoked on A: the review A stored, read from B, counts the statements both
    // fronts ran for it (its first write, two inserts, a delete, the rows read back).
    let (status, v) = fronts[0].revoke(&tid);
    assert_eq!(status, 200, "{v}");
    let (status, review) = fronts[1].raw_call("GET", &format!("/v1/tokens/{tid}/diff"), None);
    assert_eq!(status, 200, "{review}");
    let total = review["statements"]["total"].as_u64().unwrap_or(0);
    assert_eq!(
        total as usize,
        log_texts(&fronts[1], &tid).len(),
        "{review}"
    );
    assert!(total >= 5, "{review}");

    // Revoke the rest (alternating fronts, a few at once): no scratch server is left.
    std::thread::scope(|s| {
        let fronts = &fronts;
        let tokens = &tokens;
        for k in 0..THREADS {
            s.spawn(move || {
                for i in (1 + k..TOKENS).step_by(THREADS) {
                    let (status, v) = fronts[i % 2].revoke(&id(&tokens[i]));
                    assert_eq!(status, 200, "revoke {i}: {v}");
                }
            });
        }
    });
    for w in &workers {
        assert!(
            wait_until(Duration::from_secs(120), || tokens_on(&http, w).is_empty()),
            "{}: {:?}",
            w.url,
            tokens_on(&http, w)
        );
    }
    for f in &mut fronts {
        f.stop();
    }
    for w in &mut workers {
        w.stop();
    }
    for d in &fleet.dirs {
        let left = processes_in(d);
        assert!(left.is_empty(), "{}: processes left {left:?}", d.display());
    }
}
