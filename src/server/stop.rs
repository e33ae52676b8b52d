//! The second Ctrl-C: stop every local Postgres server of this gateway at once (immediate
//! shutdown, SIGQUIT) and then its process group, within a short bound. The graceful path
//! (`Gateway::shutdown`) may be waiting for sessions or for shutdown checkpoints; an operator
//! who asks twice wants out now, but never with scratch servers left running unseen.
//!
//! Servers are found on disk, not through the provider: every server the `instance` provider
//! runs (scratch instances, the review reference, a golden being built, warm-pool forks) has
//! its data dir, with a `postmaster.pid`, under `<data dir>/pg`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::pg::process;

/// How deep below `<data dir>/pg` data dirs lie (`instances/<handle>/data` is 3).
const SEARCH_DEPTH: u32 = 4;

/// Data dirs with a live postmaster under `root`, with its pid.
fn running_servers(root: &Path, depth: u32, out: &mut Vec<(i32, PathBuf)>) {
    if let Some(pf) = process::read_pid_file(root) {
        // A stale pid file may name a pid now used by something else: only a process whose
        // cwd is this data dir is its postmaster.
        if process::is_postmaster_of(pf.pid, root) {
            out.push((pf.pid, root.to_path_buf()));
            return;
        }
    }
    if depth == 0 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        // Not through symlinks below the root: nothing the provider makes is linked there.
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            running_servers(&e.path(), depth - 1, out);
        }
    }
}

/// Immediate shutdown of every Postgres server under `<data_dir>/pg`: SIGQUIT, up to `grace`
/// for them to exit, then SIGKILL of each one's process group. Returns (found, killed after
/// the grace).
pub async fn stop_local_servers_now(data_dir: &Path, grace: Duration) -> (usize, usize) {
    let root = data_dir.join("pg");
    // The root may be a symlink to a fallback directory; follow it once, here.
    let root = std::fs::canonicalize(&root).unwrap_or(root);
    let (mut found, mut killed) = (0, 0);
    // Again after a round: the graceful shutdown still runs beside this and may have been
    // starting a server while the first round looked.
    for _ in 0..3 {
        let mut servers = Vec::new();
        running_servers(&root, SEARCH_DEPTH, &mut servers);
        if servers.is_empty() {
            break;
        }
        found += servers.len();
        killed += stop_round(&servers, grace).await;
    }
    (found, killed)
}

/// SIGQUIT, wait up to `grace`, SIGKILL the groups; returns how many needed the kill.
async fn stop_round(servers: &[(i32, PathBuf)], grace: Duration) -> usize {
    for (pid, _) in servers {
        process::signal(*pid, Signal::SIGQUIT);
    }
    let deadline = tokio::time::Instant::now() + grace;
    while servers.iter().any(|(pid, _)| process::pid_alive(*pid))
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut killed = 0;
    for (pid, _) in servers {
        if process::pid_alive(*pid) {
            killed += 1;
        }
        // Stragglers in the group (backends still exiting) go too; the group is the
        // server's own (postmasters are started as session leaders).
        process::signal_group(*pid, Signal::SIGKILL);
    }
    killed
}

/// A second SIGINT/SIGTERM: the operator wants out now. Scratch servers are still stopped
/// (immediate shutdown, a few seconds at most) and the operator is told, then the process
/// exits 130. Their data stays: the next start adopts or restarts them as after a crash.
pub async fn second_signal(data_dir: &Path) -> ! {
    use super::lock;
    const GRACE: std::time::Duration = std::time::Duration::from_secs(5);
    if !lock::held() {
        // Not yet (or never) this data dir's gateway: its servers are not ours to stop.
        eprintln!("sandpit: second signal; exiting now");
        std::process::exit(130);
    }
    eprintln!(
        "sandpit: second signal; stopping the scratch Postgres servers now (immediate shutdown, up to {}s), then exiting",
        GRACE.as_secs()
    );
    tracing::warn!("second signal: immediate stop of every scratch server, then exit");
    let (found, killed) = stop_local_servers_now(data_dir, GRACE).await;
    eprintln!(
        "sandpit: stopped {found} Postgres server(s){}; exiting without the graceful shutdown (exit 130)",
        if killed > 0 {
            format!(", {killed} of them killed after {}s", GRACE.as_secs())
        } else {
            String::new()
        }
    );
    std::process::exit(130);
}
