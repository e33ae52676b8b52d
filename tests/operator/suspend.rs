//! Idle suspend: a backend without sessions is stopped (its processes gone, its data kept)
//! and the next connection starts it again.

use std::time::Duration;

use crate::support::harness::{pid_alive, psql, wait_until, Gateway, SMALL_GOLDEN};

#[test]
fn an_idle_backend_is_suspended_and_resumes_with_its_data() {
    let g = Gateway::start(
        Some(SMALL_GOLDEN),
        Some("[postgres]\nidle_suspend = \"1s\"\n"),
    );
    let t = g.issue("sleepy", 600);
    let id = t["id"].as_str().expect("id").to_string();
    let dsn = t["dsn"].as_str().expect("dsn").to_string();
    let (ok, _, err) = psql(
        &dsn,
        &[
            "-c",
            "create table kept(x int); insert into kept values (7)",
        ],
    );
    assert!(ok, "{err}");
    let pidfile = g
        .instances_dir()
        .join(&id)
        .join("data")
        .join("postmaster.pid");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
        .expect("pid");
    assert!(pid_alive(pid));
    // Suspended: the processes are gone, the data directory stays.
    assert!(
        wait_until(Duration::from_secs(15), || !pid_alive(pid)),
        "not suspended:\n{}",
        g.log()
    );
    assert!(g.instances_dir().join(&id).join("data").is_dir());
    // The log line follows the stop; give it a moment.
    assert!(wait_until(Duration::from_secs(5), || g
        .log()
        .contains("backend suspended while idle")));
    // The next connection resumes it before its first query.
    let (ok, out, err) = psql(&dsn, &["-c", "select x from kept"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "7");
    assert_eq!(g.show(&id)["fork_count"], 1, "resumed, not forked again");
}
