//! Workers' capacity, draining, placement and adoption (docs/workers.md), with real worker
//! processes and real forks: capacity moves as tokens fork and end; a draining worker gets no
//! new fork while its token keeps working; a full worker (`max_sandboxes = 1`) gets none, so
//! the next token goes to the other; when every worker is full or draining a new token fails
//! clearly; and a worker killed with SIGKILL and started again on its data dir adopts its
//! sandbox, whose token keeps working with what it made.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use super::worker::{client, dsn, id, tokens_on, with_slash, Worker, KEY};
use crate::support::harness::{connect, processes_in, tempdir, wait_until, Gateway};

fn capacity(http: &reqwest::blocking::Client, w: &Worker) -> Value {
    let r = http
        .get(format!("{}v1/capacity", with_slash(&w.url)))
        .bearer_auth(KEY)
        .send()
        .expect("capacity");
    assert_eq!(r.status(), 200);
    r.json().expect("json")
}

fn drain(http: &reqwest::blocking::Client, w: &Worker, draining: bool) -> Value {
    let r = http
        .post(format!("{}v1/drain", with_slash(&w.url)))
        .bearer_auth(KEY)
        .json(&json!({ "draining": draining }))
        .send()
        .expect("drain");
    assert_eq!(r.status(), 200);
    r.json().expect("json")
}

fn cap(max: u64, held: u64, draining: bool) -> Value {
    json!({"max_sandboxes": max, "sandboxes": held, "warm": 0, "draining": draining})
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

pub(super) fn front_over(workers: &[&Worker], ca: &Path) -> Gateway {
    let urls: Vec<String> = workers.iter().map(|w| format!("\"{}\"", w.url)).collect();
    let cfg = format!(
        "provider = \"remote\"\n[remote]\nurls = [{}]\napi_key = \"{KEY}\"\n\
         golden = \"small\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\nretries = 0\n\
         connect_timeout = \"2s\"\nrequest_timeout = \"15s\"\nfork_timeout = \"60s\"\n",
        urls.join(", "),
        ca.display()
    );
    Gateway::start(None, Some(&cfg))
}

#[test]
fn placement_by_capacity_draining_and_adoption() {
    let tmp = tempdir();
    // Worker 0 on a fixed port, so it comes back at the URL the front knows.
    let listen0 = format!("127.0.0.1:{}", free_port());
    let (dir0, extra0) = (tmp.path().join("w0"), "max_sandboxes = 1\n");
    let mut w0 = Worker::start_with(&dir0, &listen0, extra0);
    let mut w1 = Worker::start_with(&tmp.path().join("w1"), "127.0.0.1:0", "max_sandboxes = 3\n");
    let ca = tmp.path().join("workers-ca.pem");
    let mut bundle = std::fs::read(w0.dir.join("tls/cert.pem")).expect("w0 cert");
    bundle.extend(std::fs::read(w1.dir.join("tls/cert.pem")).expect("w1 cert"));
    std::fs::write(&ca, bundle).expect("bundle");
    let http = client(&ca);
    assert_eq!(capacity(&http, &w0), cap(1, 0, false));
    assert_eq!(capacity(&http, &w1), cap(3, 0, false));
    let mut front = front_over(&[&w0, &w1], &ca);
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let use_it = |t: &Value, sql: &str| {
        rt.block_on(async {
            let c = connect(&dsn(t)).await?;
            c.simple_query(sql).await.map(|_| ())
        })
    };

    // Worker 1 drains: the first token goes to worker 0, which is then full.
    assert_eq!(drain(&http, &w1, true), cap(3, 0, true));
    // Past the front's 2 s capacity cache (its watch asks the workers every 2 s), so it
    // places by the new report.
    std::thread::sleep(Duration::from_millis(2500));
    let t1 = front.issue("p-1", 600);
    use_it(&t1, "create table kept(x int); insert into kept values (7)")
        .unwrap_or_else(|e| panic!("t1: {e}\n{}", front.log_problems()));
    assert_eq!(tokens_on(&http, &w0), vec![id(&t1)]);
    assert_eq!(capacity(&http, &w0), cap(1, 1, false));
    // Asked directly, a full worker and a draining one refuse a new sandbox (once each).
    for (w, why) in [(&w0, "worker is full: 1 of 1"), (&w1, "worker is draining")] {
        let r = http
            .post(format!("{}v1/sandboxes", with_slash(&w.url)))
            .bearer_auth(KEY)
            .json(&json!({ "golden": "small" }))
            .send()
            .expect("create");
        assert_eq!(r.status(), 503);
        let body: Value = r.json().expect("json");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(why)),
            "{body}"
        );
    }

    // Worker 1 takes forks again; worker 0 is full: the next token goes to worker 1.
    assert_eq!(drain(&http, &w1, false), cap(3, 0, false));
    let t2 = front.issue("p-2", 600);
    use_it(&t2, "select 1").unwrap_or_else(|e| panic!("t2: {e}\n{}", front.log_problems()));
    assert_eq!(tokens_on(&http, &w1), vec![id(&t2)]);
    // The review reference (made after a fork, kept for the reviews) goes where there is
    // room too: worker 1 (after the first fork there was none anywhere).
    assert!(
        wait_until(Duration::from_secs(60), || capacity(&http, &w1)
            == cap(3, 2, false)),
        "{}\n{}",
        capacity(&http, &w1),
        front.log_problems()
    );

    // Worker 1 drains again: its token keeps working, a new token finds no room anywhere.
    assert_eq!(drain(&http, &w1, true), cap(3, 2, true));
    // Past the front's 2 s capacity cache, so it places by the new reports.
    std::thread::sleep(Duration::from_millis(2500));
    use_it(&t2, "select 2").expect("a draining worker's token keeps working");
    let t3 = front.issue("p-3", 600);
    let e = use_it(&t3, "select 3").expect_err("no worker has room");
    let msg = e.as_db_error().map(|d| d.message().to_string());
    assert!(
        msg.as_deref()
            .is_some_and(|m| m.contains("scratch database")),
        "{e:?}"
    );
    let t3_refused = || {
        front
            .log()
            .lines()
            .any(|l| l.contains(&id(&t3)) && l.contains("no worker takes a new sandbox: worker 0"))
    };
    assert!(
        wait_until(Duration::from_secs(10), t3_refused),
        "{}",
        front.log_problems()
    );
    // Placed by the reports: the front never asked a worker for a sandbox it had no room
    // for (the one refusal each is the direct request above).
    for w in [&w0, &w1] {
        assert_eq!(w.log().matches("create refused").count(), 1, "{}", w.log());
    }

    // A token's end frees its room (the review reference stays for later reviews).
    assert_eq!(front.revoke(&id(&t2)).0, 200);
    assert!(
        wait_until(Duration::from_secs(60), || capacity(&http, &w1)
            == cap(3, 1, true)),
        "{}",
        capacity(&http, &w1)
    );

    // Worker 0 is killed and comes back on its data dir: it adopts its sandbox, and the
    // token keeps working with what it made (through a new door with a new password).
    w0.kill();
    let mut w0 = Worker::start_with(&dir0, &listen0, extra0);
    assert!(w0.log().contains("sandbox adopted"), "{}", w0.log());
    assert_eq!(capacity(&http, &w0), cap(1, 1, false));
    let x = rt.block_on(async {
        let c = connect(&dsn(&t1)).await?;
        let row = c.query_one("select x from kept", &[]).await?;
        Ok::<i32, tokio_postgres::Error>(row.get(0))
    });
    assert_eq!(
        x.unwrap_or_else(|e| panic!("{e}\n{}", front.log_problems())),
        7
    );

    front.stop();
    w0.stop();
    w1.stop();
    for w in [&w0, &w1] {
        let left = processes_in(&w.dir);
        assert!(left.is_empty(), "processes left: {left:?}\n{}", w.log());
    }
}
