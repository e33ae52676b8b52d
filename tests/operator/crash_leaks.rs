//! Crash paths that must not leak: scratch servers a SIGKILLed gateway left running are
//! adopted by the next one (stopped at its graceful exit, suspended when idle, rid of the
//! dead gateway's busy backends), and a golden build killed mid-way leaves no staging server
//! after the restart; a SIGTERM during that build is honoured. Real `sandpit` binaries, real
//! Postgres, real clients.

use crate::support::shared_pg;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::harness::{
    connect, http, pid_alive, postmaster, processes_in, psql, query_one, redial, sqlstate, tempdir,
    wait_exit, wait_until, Body, Gateway, SMALL_GOLDEN,
};
use serde_json::Value;

/// A golden whose build never ends on its own: the staging server runs while it loads.
const SLOW_GOLDEN: &str = "create table items(id int);\nselect pg_sleep(3600);\n";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn id(t: &Value) -> String {
    t["id"].as_str().expect("id").to_string()
}

/// Pids of `postgres` processes (server binary or its children, by command line) working
/// under `dir` (their cwd or command line is there; `dir` may be reached through a symlink).
fn postgres_under(dir: &Path) -> Vec<i32> {
    processes_in(dir)
        .into_iter()
        .filter(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let argv0 = cmd.split(|b| *b == 0).next().unwrap_or_default();
            let argv0 = String::from_utf8_lossy(argv0);
            argv0.starts_with("postgres") || argv0.ends_with("/postgres")
        })
        .collect()
}

/// A gateway whose server runs for a token that has used it, then SIGKILLed: (data dir
/// holder, token, the postmaster left running).
fn killed_with_a_running_server(config: Option<&str>) -> (Gateway, Value, i32) {
    let mut g = Gateway::start(Some(SMALL_GOLDEN), config);
    let t = g.issue("left-running", 3600);
    let (ok, _, err) = psql(
        t["dsn"].as_str().expect("dsn"),
        &[
            "-c",
            "create table kept(x int); insert into kept values (7)",
        ],
    );
    assert!(ok, "{err}");
    let (pid, _) = postmaster(&g, &id(&t)).expect("postmaster.pid");
    assert!(pid_alive(pid));
    g.kill();
    // What the next start has to deal with: the server outlives the gateway.
    assert!(
        pid_alive(pid),
        "the scratch server should outlive a SIGKILL"
    );
    (g, t, pid)
}

#[test]
fn a_server_adopted_after_a_crash_and_never_used_is_stopped_by_sigterm() {
    let (old, t, pid) = killed_with_a_running_server(None);
    let dir = old.data_dir.clone();
    let mut g = Gateway::start_in(&dir, Some(SMALL_GOLDEN), None);
    assert!(pid_alive(pid), "adopted, not restarted");
    g.stop();
    assert!(g.child.is_none());
    let left = postgres_under(&dir.join("pg"));
    assert!(
        left.is_empty(),
        "postgres processes left after SIGTERM: {left:?}\n{}",
        g.log()
    );
    assert!(!pid_alive(pid));
    let log = g.log();
    assert!(
        log.contains("adopted the scratch servers left running"),
        "{log}"
    );
    let stopped = log
        .lines()
        .rev()
        .find(|l| l.contains("stopped: "))
        .unwrap_or_else(|| panic!("no summary after shutting down:\n{log}"));
    assert!(stopped.contains("1 scratch server(s) stopped"), "{stopped}");
    // Its data stays for the token's next session.
    let g = Gateway::start_in(&dir, Some(SMALL_GOLDEN), None);
    let (ok, out, err) = psql(&redial(&t, &g), &["-At", "-c", "select x from kept"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "7");
}

#[test]
fn a_server_adopted_after_a_crash_is_suspended_when_idle() {
    let config = "[postgres]\nidle_suspend = \"1s\"\n";
    let (old, t, pid) = killed_with_a_running_server(Some(config));
    let dir = old.data_dir.clone();
    let g = Gateway::start_in(&dir, Some(SMALL_GOLDEN), Some(config));
    assert!(
        wait_until(Duration::from_secs(60), || !pid_alive(pid)),
        "adopted idle server not suspended:\n{}",
        g.log()
    );
    assert!(wait_until(Duration::from_secs(10), || g
        .log()
        .contains("backend suspended while idle")));
    assert!(g.instances_dir().join(id(&t)).join("data").is_dir());
    // Suspended, not lost: the next session starts it again with its data.
    let (ok, out, err) = psql(&redial(&t, &g), &["-At", "-c", "select x from kept"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "7");
    assert_eq!(g.show(&id(&t))["fork_count"], 1);
}

#[test]
fn a_backend_left_busy_by_a_killed_gateway_is_ended_at_the_next_start() {
    let rt = rt();
    let mut g = Gateway::start(Some(SMALL_GOLDEN), None);
    let t = g.issue("busy", 3600);
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let (backend, _busy) = rt.block_on(async {
        let c = connect(&dsn)
            .await
            .map_err(|e| sqlstate(&e))
            .expect("connect");
        let pid: i32 = c
            .query_one("select pg_backend_pid()", &[])
            .await
            .map_err(|e| sqlstate(&e))
            .expect("pid")
            .get(0);
        // Busy in a statement: it does not read from its client until this ends.
        let busy = tokio::spawn(async move { c.simple_query("select pg_sleep(3600)").await });
        (pid, busy)
    });
    assert!(wait_until(Duration::from_secs(30), || {
        let cmd = std::fs::read(format!("/proc/{backend}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmd).contains("SELECT")
    }));
    let (postmaster_pid, _) = postmaster(&g, &id(&t)).expect("postmaster.pid");
    g.kill();
    // Its client (the gateway) is gone, yet the backend sleeps on: the leak to close.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pid_alive(backend),
        "precondition: the cut session's backend runs on"
    );
    let dir = g.data_dir.clone();
    let g2 = Gateway::start_in(&dir, Some(SMALL_GOLDEN), None);
    assert!(
        wait_until(Duration::from_secs(60), || !pid_alive(backend)),
        "backend {backend} of a cut session still runs:\n{}",
        g2.log()
    );
    assert!(pid_alive(postmaster_pid), "the server itself was adopted");
    let got = rt.block_on(query_one(&redial(&t, &g2), "select count(*) from items"));
    assert_eq!(
        got.map_err(|e| sqlstate(&e)).unwrap().as_deref(),
        Some("1000")
    );
    drop(g2);
    drop(g);
}

/// Starts `sandpit serve` on `dir` with `golden` without waiting for it to be ready.
fn spawn_gateway(dir: &Path, golden: &str) -> Child {
    let sql = dir.join("golden.sql");
    std::fs::write(&sql, golden).expect("golden");
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("gateway.log"))
        .expect("log");
    Command::new(env!("CARGO_BIN_EXE_sandpit"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir)
        .arg("--golden-sql")
        .arg(&sql)
        .env("SANDPIT_LOG", "info,sandpit=debug")
        .env_remove("SANDPIT_ADMIN_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn sandpit")
}

/// The staging dir and postmaster pid of a golden build in progress under `dir`.
fn staging_server(dir: &Path) -> Option<(PathBuf, i32)> {
    staging_in(&dir.join("pg").canonicalize().ok()?)
}

/// The staging dir (named `*.building*`) directly under `root` with a ready server, and its pid.
fn staging_in(root: &Path) -> Option<(PathBuf, i32)> {
    std::fs::read_dir(root).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.contains(".building") {
            return None;
        }
        let text = std::fs::read_to_string(e.path().join("data/postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        // Ready and loading (the status line), not still starting.
        (pid_alive(pid) && text.lines().nth(7).map(str::trim) == Some("ready"))
            .then(|| (e.path(), pid))
    })
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("gateway.log")).unwrap_or_default()
}

#[test]
fn a_golden_build_killed_midway_leaves_no_staging_server_after_the_restart() {
    let tmp = tempdir();
    let dir = tmp.path().to_path_buf();
    let mut child = spawn_gateway(&dir, SLOW_GOLDEN);
    let mut staging = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            staging = staging_server(&dir);
            staging.is_some()
        }),
        "no golden build in progress:\n{}",
        log_of(&dir)
    );
    let (stage_dir, pid) = staging.expect("staging");
    let _ = child.kill();
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pid_alive(pid),
        "precondition: the staging server outlives the gateway"
    );

    let g = Gateway::start_in(&dir, Some(SMALL_GOLDEN), None);
    assert!(
        !pid_alive(pid),
        "staging postmaster {pid} still runs:\n{}",
        g.log()
    );
    assert!(!stage_dir.exists(), "staging dir left");
    assert!(
        processes_in(&stage_dir).is_empty(),
        "a process still works in {stage_dir:?}"
    );
    // Only the new gateway's own servers run under the data dir (none yet: no token used).
    let left = postgres_under(&dir.join("pg"));
    assert!(left.is_empty(), "postgres processes left: {left:?}");
    drop(g);
}

#[test]
fn sigterm_during_a_golden_build_stops_the_build_and_exits() {
    let tmp = tempdir();
    let dir = tmp.path().to_path_buf();
    let mut child = spawn_gateway(&dir, SLOW_GOLDEN);
    let mut staging = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            staging = staging_server(&dir);
            staging.is_some()
        }),
        "no golden build in progress:\n{}",
        log_of(&dir)
    );
    let (_, pid) = staging.expect("staging");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    // The build would sleep for an hour: exiting at all within the limit is the point.
    let status = wait_exit(&mut child, Duration::from_secs(120));
    assert!(
        status.is_some_and(|s| s.success()),
        "gateway did not exit on SIGTERM during the build ({status:?}):\n{}",
        log_of(&dir)
    );
    assert!(!pid_alive(pid), "staging postmaster {pid} left running");
    let left = postgres_under(&dir.join("pg"));
    assert!(left.is_empty(), "postgres processes left: {left:?}");
    assert!(
        log_of(&dir).contains("stopped before ready"),
        "{}",
        log_of(&dir)
    );
}

#[test]
fn a_live_golden_build_killed_midway_leaves_no_staging_server_after_the_restart() {
    let rt = rt();
    let src = rt.block_on(shared_pg::SharedPg::start());
    // The dump waits for this lock (pg_dump locks every table it reads): the build is held
    // with its staging server up and loading.
    let locker = rt.block_on(async {
        let admin = src.admin("postgres").await;
        admin
            .batch_execute(
                "CREATE TABLE held(x int); BEGIN; LOCK TABLE held IN ACCESS EXCLUSIVE MODE",
            )
            .await
            .expect("lock");
        admin
    });
    let mut g = Gateway::start(Some(SMALL_GOLDEN), None);
    let (url, key, dsn) = (
        format!("{}/v1/goldens", g.api),
        g.admin_key.clone(),
        src.admin_dsn(),
    );
    // Blocks until the build ends, which it never does here: answered (cut) by the kill.
    let build = std::thread::spawn(move || {
        http(
            "POST",
            &url,
            Some(&key),
            Body::Json(serde_json::json!({ "from_dsn": dsn })),
        )
    });
    let versions = g.data_dir.join("pg").join("versions");
    let mut staging = None;
    assert!(
        wait_until(Duration::from_secs(120), || {
            staging = versions.canonicalize().ok().and_then(|v| staging_in(&v));
            staging.is_some()
        }),
        "no live build in progress:\n{}",
        g.log()
    );
    let (stage_dir, pid) = staging.expect("staging");
    g.kill();
    let _ = build.join();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pid_alive(pid),
        "precondition: the staging server outlives the gateway"
    );

    let dir = g.data_dir.clone();
    let g2 = Gateway::start_in(&dir, Some(SMALL_GOLDEN), None);
    assert!(
        !pid_alive(pid),
        "staging postmaster {pid} still runs:\n{}",
        g2.log()
    );
    assert!(!stage_dir.exists(), "staging dir left");
    let left = postgres_under(&dir.join("pg"));
    assert!(left.is_empty(), "postgres processes left: {left:?}");
    drop(locker);
    drop(g2);
    drop(g);
}
