//! Operations: crash safety and the janitor, graceful shutdown, metrics, logs, config checks.
//! Real `sandpit` binaries, real Postgres processes, real clients.

use crate::support::harness;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::harness::{
    metrics, pid_alive, postmaster, processes_in, query_one, redial, run_sandpit, sqlstate,
    wait_exit, wait_until, Gateway, SMALL_GOLDEN,
};
use serde_json::Value;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn s(v: &Value, k: &str) -> String {
    v[k].as_str()
        .unwrap_or_else(|| panic!("{k} in {v}"))
        .to_string()
}

/// Issue `n` tokens with `ttl` and fork each by connecting (8 at a time); each gets a marker
/// row with id `base + i`.
fn issue_and_fork(
    rt: &tokio::runtime::Runtime,
    g: &Gateway,
    n: usize,
    ttl: u64,
    base: i64,
) -> Vec<Value> {
    let toks: Vec<Value> = (0..n)
        .map(|i| g.issue(&format!("task-{base}-{i}"), ttl))
        .collect();
    let sem = Arc::new(tokio::sync::Semaphore::new(8));
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (i, t) in toks.iter().enumerate() {
            let dsn = s(t, "dsn");
            let sem = sem.clone();
            set.spawn(async move {
                let _p = sem.acquire().await.expect("semaphore");
                let sql = format!(
                    "insert into items values ({}, 'marker'); select 'ok'",
                    base + i as i64
                );
                query_one(&dsn, &sql).await
            });
        }
        while let Some(r) = set.join_next().await {
            let r = r.expect("join");
            assert_eq!(r.as_ref().map_err(sqlstate).unwrap().as_deref(), Some("ok"));
        }
    });
    toks
}

#[test]
fn sigkill_with_50_backends_then_restart_leaks_nothing_and_revives_valid_tokens() {
    let rt = rt();
    let mut g = Gateway::start(Some(SMALL_GOLDEN), None);
    let dir = g.data_dir.clone();
    let t0 = Instant::now();
    let long = issue_and_fork(&rt, &g, 30, 3600, 100_000);
    eprintln!("30 forks: {:?}", t0.elapsed());
    // Short-lived ones last: their TTL passes while the gateway is down.
    // Long enough to fork 20 at the speed just measured (twice over), no longer than needed.
    let short_ttl = (t0.elapsed().as_secs() * 4 / 3).clamp(20, 90) + 10;
    let t0 = Instant::now();
    let short = issue_and_fork(&rt, &g, 20, short_ttl, 200_000);
    // Every short token was issued by now: the last of them expires short_ttl from here at
    // the latest (waiting from t0 instead let a slow machine restart just before it expired).
    let issued = Instant::now();
    eprintln!("20 more forks: {:?}", t0.elapsed());
    assert!(
        t0.elapsed() < Duration::from_secs(short_ttl),
        "forks too slow for the short TTL"
    );
    let all: Vec<&Value> = short.iter().chain(long.iter()).collect();
    let mut running = BTreeMap::new();
    for t in &all {
        let id = s(t, "id");
        let pm = postmaster(&g, &id).unwrap_or_else(|| panic!("no postmaster.pid for {id}"));
        assert!(pid_alive(pm.0));
        running.insert(id, pm);
    }
    assert_eq!(running.len(), 50);
    assert_eq!(metrics(&g.api)["sandpit_backends"], 50.0);

    g.kill();
    // A SIGKILLed gateway leaves its Postgres servers running: that is what the janitor is for.
    assert!(running.values().all(|(pid, _)| pid_alive(*pid)));
    let inst = dir.join("pg").join("instances");
    // While it is down: one valid token's record is lost (its backend becomes unknown)…
    let unknown = s(&long[0], "id");
    std::fs::remove_file(dir.join("tokens").join(format!("{unknown}.json"))).expect("rm record");
    // …another valid token's backend vanishes…
    let vanished = s(&long[1], "id");
    let (vpid, _) = running[&vanished];
    unsafe { libc::kill(vpid, libc::SIGQUIT) };
    assert!(wait_until(Duration::from_secs(10), || !pid_alive(vpid)));
    std::fs::remove_dir_all(inst.join(&vanished)).expect("rm instance");
    // …and something that is not sandpit's sits among the instances.
    std::fs::create_dir(inst.join("not-sandpit")).expect("mkdir");
    std::fs::write(inst.join("not-sandpit").join("keep.txt"), "mine").expect("write");
    let wait = Duration::from_secs(short_ttl + 1).saturating_sub(issued.elapsed());
    std::thread::sleep(wait);

    let g = Gateway::start_in(&dir, Some(SMALL_GOLDEN), None);
    // The pass at start ran before `ready`: the expired and the unknown are gone already.
    let mut gone: Vec<String> = short.iter().map(|t| s(t, "id")).collect();
    gone.push(unknown.clone());
    for id in &gone {
        let (pid, sock) = &running[id];
        assert!(
            !pid_alive(*pid),
            "postgres of {id} still running; gateway:\n{}",
            g.log_problems()
        );
        assert!(!inst.join(id).exists(), "instance dir of {id} left");
        assert!(!sock.exists(), "socket dir of {id} left");
        assert!(
            processes_in(&inst.join(id)).is_empty(),
            "a process still points into {id}"
        );
    }
    for t in &short {
        let v = g.show(&s(t, "id"));
        assert_eq!(v["state"], "expired", "{v}");
        assert_eq!(v["backend"], false, "{v}");
    }
    assert_eq!(
        g.raw_call("GET", &format!("/v1/tokens/{unknown}"), None).0,
        404
    );
    assert!(
        inst.join("not-sandpit").join("keep.txt").exists(),
        "untagged dir touched"
    );
    assert_eq!(
        g.show(&vanished)["backend"],
        false,
        "vanished backend not marked"
    );
    // Every valid token works: adopted with its data, or (the vanished one) forked anew.
    let valid: Vec<&Value> = long[1..].iter().collect();
    rt.block_on(async {
        for (i, t) in valid.iter().enumerate() {
            let id = s(t, "id");
            let marker = format!(
                "select coalesce((select name from items where id = {}), 'none')",
                100_001 + i
            );
            let got = query_one(&redial(t, &g), &marker)
                .await
                .map_err(|e| sqlstate(&e))
                .unwrap();
            let want = if id == vanished { "none" } else { "marker" };
            assert_eq!(got.as_deref(), Some(want), "token {id}");
        }
    });
    assert_eq!(g.show(&vanished)["fork_count"], 2);
    // Every Postgres process in the instances dir belongs to a valid token.
    let valid_ids: HashSet<String> = valid.iter().map(|t| s(t, "id")).collect();
    for pid in processes_in(&inst) {
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        if cwd.as_os_str().is_empty() && !pid_alive(pid) {
            continue; // a session's server process that exited while we looked
        }
        let owner = cwd
            .strip_prefix(inst.canonicalize().expect("canon"))
            .ok()
            .and_then(|p| p.components().next())
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .unwrap_or_default();
        assert!(
            valid_ids.contains(&owner),
            "pid {pid} in {cwd:?} is not a valid token's"
        );
    }
    let (st, rep) = g.raw_call("POST", "/v1/reap?dry_run=true", None);
    assert_eq!(st, 200, "{rep}");
    assert_eq!(rep["reaped"], Value::Array(vec![]), "{rep}");
    assert_eq!(rep["vanished"], Value::Array(vec![]), "{rep}");
    assert_eq!(rep["kept"], 29, "{rep}");
    assert_eq!(rep["skipped"][0]["why"], "untagged", "{rep}");
    let m = metrics(&g.api);
    assert_eq!(m["sandpit_backends"], 29.0);
    assert_eq!(m["sandpit_tokens{state=\"expired\"}"], 20.0);
    assert_eq!(m["sandpit_janitor_reaped_total{reason=\"unknown\"}"], 1.0);
    assert_eq!(m["sandpit_janitor_vanished_total"], 1.0);
    // The expired ones were ended by resume(), before the pass, as their timers would have.
    assert_eq!(m["sandpit_tokens_ended_total{reason=\"expired\"}"], 20.0);
}

#[test]
fn token_whose_ttl_passed_while_the_gateway_was_down_is_reaped_on_start() {
    let rt = rt();
    let mut g = Gateway::start(Some(SMALL_GOLDEN), None);
    let dir = g.data_dir.clone();
    let issued = Instant::now();
    let t = g.issue("short-task", 20);
    let id = s(&t, "id");
    let got = rt.block_on(query_one(&s(&t, "dsn"), "select count(*) from items"));
    assert_eq!(
        got.map_err(|e| sqlstate(&e)).unwrap().as_deref(),
        Some("1000")
    );
    let (pid, sock) = postmaster(&g, &id).expect("postmaster");
    g.kill();
    assert!(
        issued.elapsed() < Duration::from_secs(20),
        "the fork took longer than the TTL"
    );
    std::thread::sleep(Duration::from_secs(21).saturating_sub(issued.elapsed()));
    assert!(
        pid_alive(pid),
        "the scratch server should outlive a SIGKILLed gateway"
    );
    let g = Gateway::start_in(&dir, Some(SMALL_GOLDEN), None);
    assert!(!pid_alive(pid), "{}", g.log());
    assert!(!g.instances_dir().join(&id).exists());
    assert!(!sock.exists());
    let v = g.show(&id);
    assert_eq!(
        (v["state"].as_str(), v["backend"].as_bool()),
        (Some("expired"), Some(false))
    );
    let err = rt
        .block_on(query_one(&redial(&t, &g), "select 1"))
        .unwrap_err();
    assert_eq!(sqlstate(&err), "28000");
    assert!(g.log().contains("token ended"));
}

#[test]
fn metrics_reflect_forks_sessions_caps_auth_failures_and_reaps_and_reap_cli_reports() {
    let rt = rt();
    let g = Gateway::start(Some(SMALL_GOLDEN), Some("[janitor]\ninterval = \"0s\"\n"));
    let a = g.issue("metrics-a", 600);
    let b = g.issue("metrics-b", 600);
    rt.block_on(async {
        for t in [&a, &a, &b] {
            let got = query_one(&s(t, "dsn"), "select count(*) from items").await;
            assert_eq!(
                got.map_err(|e| sqlstate(&e)).unwrap().as_deref(),
                Some("1000")
            );
        }
        let wrong = s(&a, "dsn").replace(&s(&a, "id"), "nosuchtoken");
        assert!(query_one(&wrong, "select 1").await.is_err());
        // Over the row cap (200 by default): truncated, counted.
        let got = query_one(&s(&a, "dsn"), "select g from generate_series(1, 1000) g").await;
        assert_eq!(got.map_err(|e| sqlstate(&e)).unwrap().as_deref(), Some("1"));
    });
    g.revoke(&s(&b, "id"));
    // A tagged backend of a token this gateway never issued (e.g. a lost registry record).
    let stray = g.instances_dir().join("ghost");
    std::fs::create_dir(&stray).expect("mkdir");
    let gid = std::fs::read_to_string(g.data_dir.join("gateway.id")).expect("gateway.id");
    let tag = serde_json::json!({"token_id": "ghost", "task": "ghost-task",
        "expires_at": "2030-01-01T00:00:00Z", "gateway_id": gid.trim()});
    std::fs::write(stray.join("sandpit-tag.json"), tag.to_string()).expect("tag");

    let env = [("SANDPIT_ADMIN_KEY", g.admin_key.as_str())];
    let (code, out, err) = run_sandpit(&["reap", "--dry-run", "--api", &g.api], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("dry run: 2 backends: 1 kept, 1 to reap"),
        "{out}"
    );
    assert!(
        out.contains("would reap unknown  token ghost  task ghost-task"),
        "{out}"
    );
    assert!(stray.exists(), "a dry run removed something");
    let (code, out, err) = run_sandpit(&["reap", "--api", &g.api], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("2 backends: 1 kept, 1 reaped"), "{out}");
    assert!(!stray.exists());
    let (code, out, _) = run_sandpit(&["reap", "--json", "--api", &g.api], &env);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (v["backends"].as_u64(), v["kept"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );

    let m = metrics(&g.api);
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no {k} in {m:#?}"));
    let method = m
        .keys()
        .find_map(|k| {
            k.strip_prefix("sandpit_forks_total{method=\"")?
                .strip_suffix("\"}")
        })
        .expect("forks counter")
        .to_string();
    assert_eq!(
        get(&format!("sandpit_forks_total{{method=\"{method}\"}}")),
        2.0
    );
    assert_eq!(
        get(&format!(
            "sandpit_fork_seconds_count{{method=\"{method}\"}}"
        )),
        2.0
    );
    assert_eq!(
        get(&format!(
            "sandpit_fork_seconds_bucket{{method=\"{method}\",le=\"+Inf\"}}"
        )),
        2.0
    );
    assert_eq!(get("sandpit_sessions_total"), 4.0);
    assert_eq!(get("sandpit_capped_statements_total"), 1.0);
    assert_eq!(get("sandpit_statements_total{kind=\"read\"}"), 4.0);
    assert_eq!(get("sandpit_sessions"), 0.0);
    assert_eq!(get("sandpit_backends"), 1.0);
    assert_eq!(get("sandpit_destroys_total"), 2.0);
    assert_eq!(get("sandpit_janitor_runs_total"), 3.0); // start + two by hand
    assert_eq!(get("sandpit_janitor_reaped_total{reason=\"unknown\"}"), 1.0);
    assert_eq!(get("sandpit_tokens{state=\"live\"}"), 1.0);
    assert_eq!(get("sandpit_tokens{state=\"revoked\"}"), 1.0);
    assert_eq!(get("sandpit_tokens_issued_total"), 2.0);
    assert_eq!(get("sandpit_tokens_ended_total{reason=\"revoked\"}"), 1.0);
    let auth_failures: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("sandpit_auth_failures_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(auth_failures, 1.0);
    assert!(get("sandpit_bytes_total{direction=\"client_to_backend\"}") > 0.0);
    assert!(get("sandpit_bytes_total{direction=\"backend_to_client\"}") > 0.0);
}

#[test]
fn janitor_never_touches_live_or_forking_backends() {
    let rt = rt();
    let g = Gateway::start(Some(SMALL_GOLDEN), Some("[janitor]\ninterval = \"1s\"\n"));
    let toks: Vec<Value> = (0..8).map(|i| g.issue(&format!("busy-{i}"), 600)).collect();
    let api = g.api.clone();
    let key = g.admin_key.clone();
    // Passes by hand, back to back, while the forks run.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let reaper = std::thread::spawn(move || {
        let mut passes = Vec::new();
        for _ in 0..500 {
            if stop2.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            let url = format!("{api}/v1/reap");
            let r = harness::http_ok("POST", &url, Some(&key), harness::Body::None).expect("reap");
            let r: Value = serde_json::from_str(&r.body).expect("json");
            passes.push(r);
        }
        passes
    });
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for t in &toks {
            let dsn = s(t, "dsn");
            set.spawn(async move { query_one(&dsn, "select count(*) from items").await });
        }
        while let Some(r) = set.join_next().await {
            let r = r.expect("join").map_err(|e| sqlstate(&e)).unwrap();
            assert_eq!(r.as_deref(), Some("1000"));
        }
    });
    stop.store(true, std::sync::atomic::Ordering::Release);
    let passes = reaper.join().expect("reaper");
    assert!(passes.len() > 1);
    for p in &passes {
        assert_eq!(p["reaped"], Value::Array(vec![]), "{p}");
        assert_eq!(p["errors"], Value::Array(vec![]), "{p}");
    }
    for t in &toks {
        assert_eq!(g.show(&s(t, "id"))["fork_count"], 1);
    }
}

#[test]
fn sigterm_with_10_open_sessions_ends_them_with_57p01_after_the_grace_and_exits_0() {
    let rt = rt();
    let grace = Duration::from_secs(3);
    let mut g = Gateway::start(Some(SMALL_GOLDEN), Some("shutdown_grace = \"3s\"\n"));
    let toks: Vec<Value> = (0..2).map(|i| g.issue(&format!("long-{i}"), 600)).collect();
    let pg_port = g.pg_port;
    let api = g.api.clone();
    let mut child = g.child.take().expect("child");
    let (sleepers, quick, since_term) = rt.block_on(async {
        let mut clients = Vec::new();
        for i in 0..10 {
            let dsn = s(&toks[i % 2], "dsn");
            let (c, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            clients.push(c);
        }
        let quick_client = harness::connect(&s(&toks[0], "dsn"))
            .await
            .expect("connect");
        let mut sleepers = Vec::new();
        for c in clients {
            sleepers.push(tokio::spawn(async move {
                let r = c.simple_query("select pg_sleep(60)").await;
                (r.map(|_| ()).map_err(|e| sqlstate(&e)), Instant::now())
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let term = Instant::now();
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        // A session that finishes within the grace finishes normally.
        let quick = quick_client
            .simple_query("select pg_sleep(1)")
            .await
            .map(|_| ());
        // New connections are refused while the grace runs.
        let refused = tokio::net::TcpStream::connect(("127.0.0.1", pg_port))
            .await
            .is_err();
        assert!(
            refused,
            "a new connection was accepted during the grace period"
        );
        // The control API still answers (a harness may revoke, /metrics is scraped).
        let health = tokio::task::spawn_blocking(move || {
            harness::http("GET", &format!("{api}/healthz"), None, harness::Body::None)
                .map(|r| r.status)
        });
        assert_eq!(health.await.expect("join").expect("healthz"), 200);
        let mut out = Vec::new();
        for h in sleepers {
            out.push(h.await.expect("join"));
        }
        (out, quick, term)
    });
    assert!(quick.is_ok(), "{quick:?}");
    for (r, at) in &sleepers {
        assert_eq!(r.as_ref().unwrap_err(), "57P01");
        // They were given the whole grace period (a lower bound, so not a timing race).
        assert!(*at >= since_term + grace - Duration::from_millis(200));
    }
    let status = wait_exit(&mut child, Duration::from_secs(60)).expect("gateway did not exit");
    assert_eq!(status.code(), Some(0), "{}", g.log());
    assert!(g.log().contains("waiting for open sessions"));
}

#[test]
fn json_logs_carry_token_and_task_and_no_secret_is_ever_logged() {
    let rt = rt();
    let g = Gateway::start_with(
        Some(SMALL_GOLDEN),
        None,
        &["--log-format", "json"],
        &[("SANDPIT_LOG", "trace,hyper=info,h2=info")],
    );
    let toks: Vec<Value> = (0..3)
        .map(|i| g.issue(&format!("log-task-{i}"), 600))
        .collect();
    let secret = |t: &Value| {
        let dsn = s(t, "dsn");
        let rest = dsn
            .split_once(':')
            .expect("scheme")
            .1
            .trim_start_matches('/');
        rest.split_once(':')
            .expect("id")
            .1
            .split_once('@')
            .expect("secret")
            .0
            .to_string()
    };
    rt.block_on(async {
        // SCRAM, cleartext with a different user name, and a wrong secret.
        let got = query_one(&s(&toks[0], "dsn"), "select count(*) from items").await;
        assert_eq!(
            got.map_err(|e| sqlstate(&e)).unwrap().as_deref(),
            Some("1000")
        );
        let clear = format!(
            "postgresql://someone:{}.{}@127.0.0.1:{}/sandpit",
            s(&toks[1], "id"),
            secret(&toks[1]),
            g.pg_port
        );
        let got = query_one(&clear, "select 2").await;
        assert_eq!(got.map_err(|e| sqlstate(&e)).unwrap().as_deref(), Some("2"));
        let wrong = s(&toks[2], "dsn").replace(&secret(&toks[2]), &"A".repeat(43));
        assert_eq!(
            sqlstate(&query_one(&wrong, "select 1").await.unwrap_err()),
            "28P01"
        );
    });
    let log = g.log();
    for t in &toks {
        assert!(!log.contains(&secret(t)), "a token secret is in the log");
    }
    assert!(!log.contains(&g.admin_key), "the admin key is in the log");
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    // Every line of a session after its token is known carries token and task.
    let mut seen = BTreeMap::<String, Vec<String>>::new();
    for l in &lines {
        let Some(conn) = l["spans"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == "conn"))
        else {
            continue;
        };
        let peer = s(conn, "peer");
        let token = conn["token"].as_str();
        let msg = l["fields"]["message"].as_str().unwrap_or("").to_string();
        match token {
            Some(tok) => {
                let t = toks
                    .iter()
                    .find(|t| s(t, "id") == tok)
                    .expect("known token");
                assert_eq!(conn["task"].as_str(), Some(s(t, "task").as_str()), "{l}");
                seen.entry(peer).or_default().push(format!("{tok} {msg}"));
            }
            None => assert!(
                !seen.contains_key(&peer),
                "line without token after auth: {l}"
            ),
        }
    }
    for t in &toks[..2] {
        let id = s(t, "id");
        for what in ["session started", "session ended"] {
            let line = format!("{id} {what}");
            assert!(
                seen.values().flatten().any(|m| *m == line),
                "no '{what}' for {id}"
            );
        }
    }
}

#[test]
fn bad_config_is_an_error_naming_the_key_and_check_config_starts_nothing() {
    let tmp = harness::tempdir();
    let write = |name: &str, text: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).expect("write");
        p.to_string_lossy().to_string()
    };
    let data = tmp.path().join("data-not-created");
    let data = data.to_string_lossy().to_string();
    let bad = write("bad.toml", "[janitor]\nintervall = \"10s\"\n");
    let (code, _, err) = run_sandpit(&["serve", "--config", &bad, "--data-dir", &data], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("intervall"), "{err}");
    let bad_value = write("bad_value.toml", "shutdown_grace = \"soonish\"\n");
    let (code, _, err) = run_sandpit(&["serve", "--check-config", "--config", &bad_value], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("shutdown_grace"), "{err}");
    let invalid = write("invalid.toml", "[janitor]\ninterval = \"5ms\"\n");
    let (code, _, err) = run_sandpit(&["serve", "--check-config", "--config", &invalid], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("janitor.interval"), "{err}");
    let (code, _, err) = run_sandpit(
        &["serve", "--check-config", "--data-dir", &data],
        &[("SANDPIT_SHUTDOWN_GRACE", "later")],
    );
    assert_eq!(code, 1);
    assert!(err.contains("SANDPIT_SHUTDOWN_GRACE"), "{err}");
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/sandpit.toml");
    let (code, out, err) = run_sandpit(
        &[
            "serve",
            "--check-config",
            "--config",
            shipped,
            "--data-dir",
            &data,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "config ok");
    let missing = write(
        "missing.toml",
        "[golden]\nsql = \"/nonexistent/golden.sql\"\n",
    );
    let (code, _, err) = run_sandpit(&["serve", "--check-config", "--config", &missing], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("golden.sql"), "{err}");
    assert!(
        !Path::new(&data).exists(),
        "--check-config created the data dir"
    );
}
