//! Worker mode (docs/workers.md): one front gateway with the `remote` provider over two real
//! worker processes (`serve` with `[worker] listen`, own data dirs, instance forks of real
//! Postgres). Tokens spread by the workers' room and keep their worker; the worker's API wants its
//! bearer key and TLS; a fork's door wants TLS and the fork's own password, which the agent's
//! DSN does not carry; revoke stores a review; a killed worker fails its tokens with a clear
//! error while the other's keep working; and no scratch server outlives the workers.

use crate::support::harness;
use crate::support::netns::Netns;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::harness::{connect, processes_in, tempdir, wait_until, Gateway, SMALL_GOLDEN};
use serde_json::Value;

pub(super) const KEY: &str = "worker-test-bearer-key-0123456789";

/// A worker process.
pub(super) struct Worker {
    child: Option<Child>,
    pub(super) dir: PathBuf,
    pub(super) url: String,
}

impl Worker {
    fn start(dir: &Path) -> Worker {
        Worker::start_with(dir, "127.0.0.1:0", "")
    }

    /// A worker on `listen`, with `extra` lines in its `[worker]` section.
    pub(super) fn start_with(dir: &Path, listen: &str, extra: &str) -> Worker {
        Worker::start_inside(None, dir, listen, extra)
    }

    /// [`Worker::start_with`], inside network namespace `ns` when given.
    pub(super) fn start_inside(
        ns: Option<&Netns>,
        dir: &Path,
        listen: &str,
        extra: &str,
    ) -> Worker {
        std::fs::create_dir_all(dir).expect("dir");
        let sql = dir.join("golden.sql");
        std::fs::write(&sql, SMALL_GOLDEN).expect("golden");
        let cfg = dir.join("worker.toml");
        std::fs::write(
            &cfg,
            format!(
                "[worker]\nlisten = \"{listen}\"\napi_key = \"{KEY}\"\ngolden = \"small\"\n{extra}"
            ),
        )
        .expect("config");
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join("worker.log"))
            .expect("log");
        let bin = env!("CARGO_BIN_EXE_sandpit");
        let mut cmd = ns.map_or_else(|| Command::new(bin), |n| n.command(bin));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .arg("--golden-sql")
            .arg(&sql)
            .arg("--config")
            .arg(&cfg)
            .env("SANDPIT_LOG", "info,sandpit=debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        // If the test process dies, the worker gets SIGTERM and deletes its forks.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn worker");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("sandpit worker ready api=") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let Ok(url) = rx.recv_timeout(Duration::from_secs(240)) else {
            let _ = child.kill();
            let log = std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default();
            panic!("worker did not become ready; log:\n{log}");
        };
        assert!(url.starts_with("https://"), "{url}");
        Worker {
            child: Some(child),
            dir: dir.to_path_buf(),
            url,
        }
    }

    /// The worker's process id, while it runs.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("worker.log")).unwrap_or_default()
    }

    pub(super) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if harness::wait_exit(&mut c, Duration::from_secs(30)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTPS client that trusts the workers' certificates (and nothing it was not given).
pub(super) fn client(ca: &Path) -> reqwest::blocking::Client {
    let pem = std::fs::read(ca).expect("ca");
    let mut b = reqwest::blocking::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false);
    for c in reqwest::Certificate::from_pem_bundle(&pem).expect("pem") {
        b = b.add_root_certificate(c);
    }
    b.build().expect("client")
}

/// The worker's sandboxes made for tokens (not the front's review references).
pub(super) fn token_sandboxes(http: &reqwest::blocking::Client, w: &Worker) -> Vec<Value> {
    let r = http
        .get(format!(
            "{}v1/sandboxes?label=sandpit.owner%3Dsandpit",
            with_slash(&w.url)
        ))
        .bearer_auth(KEY)
        .send()
        .expect("list");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().expect("json");
    v["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .filter(|s| {
            !s["metadata"]["sandpit.token"]
                .as_str()
                .unwrap_or("")
                .starts_with("sandpit-review-reference")
        })
        .cloned()
        .collect()
}

pub(super) fn with_slash(u: &str) -> String {
    format!("{}/", u.trim_end_matches('/'))
}

pub(super) fn tokens_on(http: &reqwest::blocking::Client, w: &Worker) -> Vec<String> {
    let mut t: Vec<String> = token_sandboxes(http, w)
        .iter()
        .filter_map(|s| s["metadata"]["sandpit.token"].as_str().map(str::to_string))
        .collect();
    t.sort();
    t
}

pub(super) fn dsn(t: &Value) -> String {
    t["dsn"].as_str().expect("dsn").to_string()
}

pub(super) fn id(t: &Value) -> String {
    t["id"].as_str().expect("id").to_string()
}

#[test]
fn a_front_over_two_workers() {
    let tmp = tempdir();
    let mut w0 = Worker::start(&tmp.path().join("w0"));
    let mut w1 = Worker::start(&tmp.path().join("w1"));
    // Each worker made its own self-signed certificate; the front trusts both.
    let ca = tmp.path().join("workers-ca.pem");
    let mut bundle = std::fs::read(w0.dir.join("tls/cert.pem")).expect("w0 cert");
    bundle.extend(std::fs::read(w1.dir.join("tls/cert.pem")).expect("w1 cert"));
    std::fs::write(&ca, bundle).expect("bundle");
    let http = client(&ca);

    // The API wants the key.
    let r = http
        .get(format!("{}v1/sandboxes", with_slash(&w0.url)))
        .bearer_auth("not-the-key-not-the-key")
        .send()
        .expect("list");
    assert_eq!(r.status(), 401);

    let cfg = format!(
        "provider = \"remote\"\n[remote]\nurls = [\"{}\", \"{}\"]\napi_key = \"{KEY}\"\n\
         golden = \"small\"\nsslmode = \"verify-full\"\nca_file = \"{}\"\nretries = 0\n\
         connect_timeout = \"2s\"\nrequest_timeout = \"15s\"\nfork_timeout = \"60s\"\n",
        w0.url,
        w1.url,
        ca.display()
    );
    let mut front = Gateway::start(None, Some(&cfg));
    let rt = tokio::runtime::Runtime::new().expect("rt");

    // Four tokens, each used once (the first connection forks): two per worker.
    let tokens: Vec<Value> = (0..4)
        .map(|i| front.issue(&format!("w-{i}"), 600))
        .collect();
    rt.block_on(async {
        for (i, t) in tokens.iter().enumerate() {
            let c = connect(&dsn(t))
                .await
                .unwrap_or_else(|e| panic!("token {i}: {e}\n{}", front.log_problems()));
            c.batch_execute(&format!(
                "create table mine_{i}(x int); insert into mine_{i} values ({i})"
            ))
            .await
            .expect("ddl");
        }
    });
    let on0 = tokens_on(&http, &w0);
    let on1 = tokens_on(&http, &w1);
    let mut all: Vec<String> = on0.iter().chain(&on1).cloned().collect();
    all.sort();
    let mut want: Vec<String> = tokens.iter().map(id).collect();
    want.sort();
    assert_eq!(all, want, "every token on exactly one worker");
    // Placed by room: each worker's count (its tokens, and the review reference one of them
    // holds) differs from the other's by at most one.
    let held = |w: &Worker| {
        let r = http
            .get(format!("{}v1/capacity", with_slash(&w.url)))
            .bearer_auth(KEY)
            .send()
            .expect("capacity");
        r.json::<Value>().expect("json")["sandboxes"]
            .as_i64()
            .expect("sandboxes")
    };
    assert!(!on0.is_empty() && !on1.is_empty(), "{on0:?} {on1:?}");
    assert!((held(&w0) - held(&w1)).abs() <= 1, "{on0:?} {on1:?}");

    // A token keeps its worker: a second session sees what the first one made.
    rt.block_on(async {
        for (i, t) in tokens.iter().enumerate() {
            let c = connect(&dsn(t)).await.expect("again");
            let x: i32 = c
                .query_one(&format!("select x from mine_{i}"), &[])
                .await
                .expect("own table")
                .get(0);
            assert_eq!(x, i as i32);
        }
    });

    // A fork's door: TLS and the fork's password; the agent's DSN and token carry neither.
    let sb = &token_sandboxes(&http, &w0)[0];
    let c = &sb["connection"];
    let (host, port) = (
        c["host"].as_str().expect("host"),
        c["port"].as_u64().expect("port"),
    );
    let password = c["password"].as_str().expect("a password per fork");
    for t in &tokens {
        assert!(
            !t.to_string().contains(password),
            "the agent's token names the fork password"
        );
    }
    rt.block_on(async {
        let plain = format!(
            "host={host} port={port} user={} password={password} dbname={} sslmode=disable",
            c["user"].as_str().expect("user"),
            c["database"].as_str().expect("db")
        );
        let e = connect(&plain).await.expect_err("no TLS, no entry");
        assert!(format!("{e:?}").contains("TLS is required"), "{e:?}");
        let opts = |pw: &str| {
            sqlx::postgres::PgConnectOptions::new()
                .host(host)
                .port(port as u16)
                .username(c["user"].as_str().expect("user"))
                .password(pw)
                .database(c["database"].as_str().expect("db"))
                .ssl_mode(sqlx::postgres::PgSslMode::VerifyFull)
                .ssl_root_cert(&ca)
        };
        use sqlx::Connection;
        let e = sqlx::PgConnection::connect_with(&opts("wrong-password"))
            .await
            .expect_err("wrong password");
        assert!(
            e.to_string().contains("password authentication failed"),
            "{e}"
        );
        let e = sqlx::PgConnection::connect_with(&opts(password).username("postgres"))
            .await
            .expect_err("another role");
        assert!(e.to_string().contains("its own role only"), "{e}");
        let mut ok = sqlx::PgConnection::connect_with(&opts(password))
            .await
            .expect("the fork's password over TLS");
        let one: i32 = sqlx::query_scalar("select 1")
            .fetch_one(&mut ok)
            .await
            .expect("q");
        assert_eq!(one, 1);
        let _ = ok.close().await;
    });

    // Revoke stores a review (of what the token did on its worker) and deletes the sandbox.
    let t0 = id(&tokens[0]);
    let holder = if on0.contains(&t0) { &w0 } else { &w1 };
    let (status, _) = front.revoke(&t0);
    assert_eq!(status, 200);
    let mut review = Value::Null;
    let stored = wait_until(Duration::from_secs(60), || {
        let (s, v) = front.raw_call("GET", &format!("/v1/tokens/{t0}/review"), None);
        review = v;
        s == 200
    });
    assert!(stored, "no review: {review}\n{}", front.log_problems());
    // The captured change: one table made, one row in it.
    assert_eq!(review["capture"]["complete"], true, "{review:#}");
    assert_eq!(review["capture"]["schema_changes"], 1, "{review:#}");
    assert_eq!(review["capture"]["rows"], 1, "{review:#}");
    let (s, diff) = front.raw_call("GET", &format!("/v1/tokens/{t0}/diff"), None);
    assert_eq!(s, 200, "{diff}");
    assert!(diff.to_string().contains("public.mine_0"), "{diff:#}");
    assert!(
        wait_until(Duration::from_secs(30), || !tokens_on(&http, holder)
            .contains(&t0)),
        "sandbox of a revoked token still on its worker"
    );

    // Worker 1 is killed: its tokens fail with a clear error, worker 0's keep working, and a
    // new token goes to worker 0.
    let (dead, alive): (Vec<&Value>, Vec<&Value>) =
        tokens[1..].iter().partition(|t| on1.contains(&id(t)));
    assert!(!dead.is_empty() && !alive.is_empty());
    w1.kill();
    let orphans = processes_in(&w1.dir);
    assert!(
        !orphans.is_empty(),
        "a killed worker's scratch servers outlive it"
    );
    let fresh = rt.block_on(async {
        for t in &dead {
            let e = connect(&dsn(t)).await.expect_err("its worker is gone");
            let msg = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_default();
            assert!(msg.contains("scratch database"), "{e:?}");
            eprintln!("a dead worker's token: {msg}");
        }
        for t in &alive {
            let c = connect(&dsn(t)).await.expect("the other worker's token");
            c.simple_query("select 1").await.expect("query");
        }
        let fresh = front.issue("w-after", 600);
        let c = connect(&dsn(&fresh)).await.unwrap_or_else(|e| {
            panic!(
                "a new token after a worker died: {e}\n{}",
                front.log_problems()
            )
        });
        c.simple_query("select count(*) from items")
            .await
            .expect("query");
        fresh
    });
    assert!(tokens_on(&http, &w0).contains(&id(&fresh)));
    assert!(
        front.log().contains(&format!("worker 1 ({})", w1.url)),
        "the front's log names the dead worker\n{}",
        front.log_problems()
    );

    // No scratch server outlives the workers: the killed one's are adopted when it comes
    // back on its data dir (their TTL has not passed), and a worker that stops stops their
    // servers and keeps them, each with its record, for its next start.
    let dir1 = w1.dir.clone();
    drop(w1);
    let mut w1 = Worker::start(&dir1);
    front.stop();
    w0.stop();
    w1.stop();
    for w in [&w0, &w1] {
        let left = processes_in(&w.dir);
        assert!(
            left.is_empty(),
            "processes left in {}: {left:?}\n{}",
            w.dir.display(),
            w.log()
        );
        let count = |d: &std::path::Path| std::fs::read_dir(d).map(|d| d.count()).unwrap_or(0);
        let inst = w.dir.join("pg/instances");
        assert_eq!(
            count(&inst),
            count(&w.dir.join("worker/sandboxes")),
            "forks left in {} that are not kept sandboxes",
            inst.display()
        );
    }
}
