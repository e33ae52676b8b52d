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
use crate::provider::golden;
use crate::provider::{Backend, ProviderError};

impl InstanceProvider {
    /// Starts the instance's server and remembers the child.
    pub(super) async fn start(&self, handle: &str, inst: &Path) -> Result<(), ProviderError> {
        let sock = golden::socket_dir_for(inst);
        golden::prepare_socket_dir(&sock, &self.run_as)?;
        let data = inst.join("data");
        let log = inst.join("postgres.log");
        let extra: Vec<(&str, String)> = self
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
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

    pub(super) async fn ensure_inner(&self, handle: &str) -> Result<Backend, ProviderError> {
        let inst = self.inst_dir(handle)?;
        let data = inst.join("data");
        if !data.is_dir() {
            return Err(ProviderError::NotFound(handle.to_string()));
        }
        let sock = golden::socket_dir_for(&inst);
        let deadline = Instant::now() + process::READY_TIMEOUT;
        loop {
            match process::read_pid_file(&data) {
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
