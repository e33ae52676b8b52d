//! Scratch directories the unprivileged Postgres user can reach, for the test harness and for
//! the shared servers in `tests/support/` (also built into `examples/bench_backends.rs`).
//!
//! Each directory names the test process that made it (`.sandpit-test-owner`). The first
//! directory a test process makes sweeps away those whose process is gone, stopping any
//! Postgres server still running inside them first, so a test run that died or leaked a
//! process-long gateway leaves nothing behind after the next run starts.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Once;

/// The file in each scratch directory that holds the pid of the test process that made it.
pub const OWNER_FILE: &str = ".sandpit-test-owner";
const PREFIX: &str = "sandpit-test-";

/// A fresh directory under `TMPDIR` (mode 0755), removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(sweep_stale);
    let t = tempfile::Builder::new()
        .prefix(PREFIX)
        .tempdir()
        .expect("tempdir");
    // The unprivileged Postgres user must be able to reach below it.
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(t.path().join(OWNER_FILE), std::process::id().to_string()).expect("owner");
    t
}

fn pid_alive(pid: i32) -> bool {
    // EPERM still means the process exists.
    pid > 0
        && (unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// Removes the scratch directories of test processes that no longer run.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let dir = e.path();
        let owner = std::fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        // Directories without an owner file are left alone: not ours to judge.
        let Some(owner) = owner else { continue };
        if pid_alive(owner) {
            continue;
        }
        stop_servers_under(&dir, 6);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// SIGKILLs every postmaster whose `postmaster.pid` lies under `dir` (its children exit
/// when they notice the postmaster is gone), waiting briefly for each to go.
#[allow(dead_code)]
pub fn stop_servers_under(dir: &Path, depth: u32) {
    let pidfile = dir.join("postmaster.pid");
    if let Ok(text) = std::fs::read_to_string(&pidfile) {
        if let Some(pid) = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<i32>().ok())
        {
            // A stale pid file may name a pid reused by something else: postgres only.
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if pid_alive(pid) && comm.trim() == "postgres" {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                for _ in 0..200 {
                    if !pid_alive(pid) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }
    if depth == 0 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            stop_servers_under(&e.path(), depth - 1);
        }
    }
}
