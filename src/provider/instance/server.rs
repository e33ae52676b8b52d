//! Server processes of the `instance` provider: starting, stopping and adopting (or
//! restarting) the postmaster of each instance.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::process::Child;

use super::{InstanceProvider, STOP_GRACE};
use crate::pg::process::{self, ServerSpec};
use crate::provider::golden::{self, DATABASE, SUPERUSER};
use crate::provider::{Backend, ProviderError};

impl InstanceProvider {
    /// Starts the instance's server and remembers the child.
    pub(super) async fn start(&self, handle: &str, inst: &Path) -> Result<(), ProviderError> {
        let sock = golden::socket_dir_for(inst);
        golden::prepare_socket_dir(&sock, &self.run_as)?;
        let data = inst.join("data");
        let log = inst.join("postgres.log");
        // A commit is acknowledged only once its WAL is written (to the OS, not synced: fsync
        // stays off): a crashed postmaster loses no acknowledged write, so the review after a
        // restart shows everything the agent was told was committed. The configured settings
        // come after it.
        let mut extra: Vec<(&str, String)> = vec![("synchronous_commit", "on".to_string())];
        extra.extend(self.settings.iter().map(|(k, v)| (k.as_str(), v.clone())));
        let spec = ServerSpec {
            bins: &self.bins,
            run_as: &self.run_as,
            netns: self.netns,
            data: &data,
            socket_dir: &sock,
            log: &log,
            max_connections: self.max_connections,
            extra: &extra,
        };
        let child = process::start_postgres(&spec).await?;
        self.lock_children().insert(handle.to_string(), child);
        Ok(())
    }

    pub(super) fn lock_children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Child>> {
        // A panic while holding the lock cannot leave the map inconsistent: keep going.
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops whatever postmaster runs for `inst` with `sig`, waiting up to `grace`.
    pub(super) async fn stop_server(
        &self,
        handle: &str,
        inst: &Path,
        sig: Signal,
        grace: Duration,
    ) {
        let data = inst.join("data");
        let mut child = self.lock_children().remove(handle);
        let child_pid = child.as_ref().and_then(|c| c.id()).map(|p| p as i32);
        let file_pid = process::read_pid_file(&data)
            .map(|pf| pf.pid)
            .filter(|&pid| process::is_postmaster_of(pid, &data));
        if let Some(pid) = child_pid {
            process::stop_postmaster(pid, child.as_mut(), sig, grace).await;
        }
        if let Some(pid) = file_pid.filter(|p| Some(*p) != child_pid) {
            process::stop_postmaster(pid, None, sig, grace).await;
        }
    }

    /// Whether the postmaster of instance `handle` runs (starting, ready or stopping).
    pub(super) fn server_running(&self, handle: &str) -> Option<bool> {
        let data = self.inst_dir(handle).ok()?.join("data");
        if !data.is_dir() {
            return None;
        }
        Some(
            process::read_pid_file(&data)
                .is_some_and(|pf| process::is_postmaster_of(pf.pid, &data)),
        )
    }

    /// Ends every client session on the running server of `handle` but the one asking
    /// (superuser over the instance's socket, peer-mapped like the golden build's), waiting
    /// until each is gone. Returns how many were ended.
    pub(super) async fn end_stale_sessions_inner(
        &self,
        handle: &str,
    ) -> Result<u64, ProviderError> {
        let inst = self.inst_dir(handle)?;
        let sock = golden::socket_dir_for(&inst);
        let failed = |source: tokio_postgres::Error| ProviderError::Sql {
            what: format!("ending stale sessions of {handle}"),
            source,
        };
        let (client, conn) = tokio_postgres::Config::new()
            .host_path(&sock)
            .port(process::PORT)
            .user(SUPERUSER)
            .dbname(DATABASE)
            .application_name("sandpit adopt")
            .connect_timeout(Duration::from_secs(10))
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(failed)?;
        let conn = tokio::spawn(conn);
        // With a timeout, pg_terminate_backend waits for the process to exit (PostgreSQL 14+),
        // so a backend stuck in a long statement is gone when this returns.
        let wait = if self.bins.major >= 14 { ", 10000" } else { "" };
        let sql = format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid{wait})) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        );
        let ended: i64 = client.query_one(&sql, &[]).await.map_err(failed)?.get(0);
        drop(client);
        let _ = conn.await;
        Ok(ended.max(0) as u64)
    }

    pub(super) async fn ensure_inner(&self, handle: &str) -> Result<Backend, ProviderError> {
        let inst = self.inst_dir(handle)?;
        let data = inst.join("data");
        if !data.is_dir() {
            return Err(ProviderError::NotFound(handle.to_string()));
        }
        let sock = golden::socket_dir_for(&inst);
        let deadline = Instant::now() + process::READY_TIMEOUT;
        let mut dead_pid = None;
        loop {
            let pid_file = process::read_pid_file(&data);
            dead_pid = pid_file.as_ref().map(|pf| pf.pid).or(dead_pid);
            match pid_file {
                Some(pf) if process::is_postmaster_of(pf.pid, &data) => {
                    if pf.status == "ready" {
                        if process::socket_path(&sock).exists() {
                            return Ok(self.backend(handle, "adopted"));
                        }
                        // Running but unreachable (e.g. a /tmp cleaner removed its socket dir):
                        // restart it so it listens again.
                        tracing::warn!(
                            handle,
                            "instance running without its socket; restarting it"
                        );
                        self.stop_server(handle, &inst, Signal::SIGINT, STOP_GRACE)
                            .await;
                        continue;
                    }
                    // Starting up (or shutting down): wait for it to settle.
                    if Instant::now() > deadline {
                        return Err(ProviderError::NotReady(format!(
                            "instance {handle} stuck in state {:?}",
                            pf.status
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => break,
            }
        }
        // A postmaster that died (kill -9, OOM killer) leaves its backends running until they
        // notice; while one lives, the new server refuses to start on the same data dir.
        if let Some(pid) = dead_pid {
            end_orphans(pid, &data, &self.bins.postgres).await;
        }
        // Stale lock files could name a pid that now belongs to someone else; no postmaster of
        // this instance runs, so they are safe to drop. Postgres does crash recovery itself.
        let _ = fs::remove_file(data.join("postmaster.pid"));
        let _ = fs::remove_file(sock.join(format!("{}.lock", process::SOCKET_FILE)));
        let _ = fs::remove_file(process::socket_path(&sock));
        self.lock_children().remove(handle);
        let t0 = Instant::now();
        self.start(handle, &inst).await?;
        tracing::info!(
            handle,
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "instance restarted"
        );
        Ok(self.backend(handle, "restart"))
    }
}

/// How long the orphans of a dead postmaster get to go after SIGKILL.
const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// SIGKILLs what is left of a server whose postmaster (`pid`) died: processes of the server
/// binary `postgres` that still work in `data` (each chdirs there; backends lead process
/// groups of their own, so the postmaster's group does not find them). Called only when no
/// postmaster of `data` runs, so every such process is an orphan. Waits until they are gone.
async fn end_orphans(pid: i32, data: &Path, postgres: &Path) {
    let want = fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
    let exe = fs::canonicalize(postgres).unwrap_or_else(|_| postgres.to_path_buf());
    let orphans: Vec<i32> = match fs::read_dir("/proc") {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&p| process::pid_alive(p))
            .filter(|&p| fs::read_link(format!("/proc/{p}/cwd")).is_ok_and(|c| c == want))
            .filter(|&p| fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == exe))
            .collect(),
        Err(_) => Vec::new(),
    };
    if orphans.is_empty() {
        return;
    }
    tracing::warn!(
        pid,
        orphans = orphans.len(),
        "postmaster died; ending the server processes it left"
    );
    for p in &orphans {
        process::signal(*p, Signal::SIGKILL);
    }
    let deadline = Instant::now() + ORPHAN_GRACE;
    while Instant::now() < deadline {
        if orphans.iter().all(|&p| !process::pid_alive(p)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::warn!(pid, "processes of a dead postmaster did not exit");
}
