//! The review reference of the `instance` provider: a pristine fork of a golden version,
//! started on first use, that review diffs compare against.

use std::fs;
use std::path::Path;
use std::time::Instant;

use nix::sys::signal::Signal;

use super::{validate_handle, InstanceProvider, DESTROY_GRACE};
use crate::pg::process;
use crate::pgconn::{BackendTarget, Endpoint};
use crate::provider::copy;
use crate::provider::dirs::make_dir;
use crate::provider::golden::versions;
use crate::provider::golden::{self, AGENT, DATABASE, REVIEWER};
use crate::provider::{Backend, ProviderError};

/// Directory (under the real root, outside `instances/`, so `list()` never sees it) of the
/// reference backend: a pristine fork of the golden that review diffs compare against.
const REFERENCE_DIR: &str = "reference";
/// Key prefix of reference servers in the children map (token handles start with `sp_`).
const REFERENCE_KEY: &str = "reference";

impl InstanceProvider {
    /// Stops every reference server and removes their files (also the single `reference/`
    /// of older gateways).
    pub(super) async fn remove_references(&self) -> Result<(), ProviderError> {
        let dir = self.real_root.join(REFERENCE_DIR);
        if dir.join("data").exists() {
            self.remove_reference_at(REFERENCE_KEY, &dir).await?;
        }
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let id = e.file_name().to_string_lossy().to_string();
                if validate_handle(&id).is_ok() && e.path().is_dir() {
                    self.remove_reference(&id).await?;
                }
            }
        }
        Ok(())
    }

    /// Stops the reference server of golden `id` (if any) and removes its files.
    pub(in crate::provider) async fn remove_reference(
        &self,
        id: &str,
    ) -> Result<(), ProviderError> {
        let inst = self.real_root.join(REFERENCE_DIR).join(id);
        self.remove_reference_at(&format!("{REFERENCE_KEY}-{id}"), &inst)
            .await
    }

    async fn remove_reference_at(&self, key: &str, inst: &Path) -> Result<(), ProviderError> {
        let sock = golden::socket_dir_for(inst);
        if inst.join("data").exists() {
            self.stop_server(key, inst, Signal::SIGQUIT, DESTROY_GRACE)
                .await;
        }
        if inst.exists() {
            let dir = inst.to_path_buf();
            tokio::task::spawn_blocking(move || match fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .await
            .map_err(|source| ProviderError::Task {
                what: "remove task".into(),
                source,
            })??;
        }
        golden::remove_socket_dir(&sock, inst)?;
        Ok(())
    }

    /// The running reference backend of golden `version` (the active one when None),
    /// forked from that golden on first use.
    pub(super) async fn reference_inner(
        &self,
        version: Option<&str>,
    ) -> Result<Backend, ProviderError> {
        let _guard = self.reference_lock.lock().await;
        let _gate = self.versions.read_gate().await;
        let golden = match version {
            None => self.versions.active(),
            Some(id) => versions::find_golden(self, id)?,
        };
        let key = format!("{REFERENCE_KEY}-{}", golden.id);
        make_dir(&self.real_root.join(REFERENCE_DIR), 0o711)?;
        let inst = self.real_root.join(REFERENCE_DIR).join(&golden.id);
        let data = inst.join("data");
        let sock = golden::socket_dir_for(&inst);
        // Only the review reads it, as its own role (goldens older than that role: the agent).
        let user = if golden::predates_policy_roles(&golden.dir.join("data")) {
            AGENT
        } else {
            REVIEWER
        };
        let backend = Backend {
            handle: key.clone(),
            target: BackendTarget {
                endpoint: Endpoint::unix(process::socket_path(&sock)),
                user: user.to_string(),
                database: DATABASE.to_string(),
                password: None,
                gate: None,
            },
            method: "reference".to_string(),
            netns: self.netns,
            golden: Some(golden.id.clone()),
        };
        if let Some(pf) = process::read_pid_file(&data) {
            if process::is_postmaster_of(pf.pid, &data)
                && pf.status == "ready"
                && backend.target.socket_path().is_some_and(|p| p.exists())
            {
                return Ok(backend);
            }
        }
        // Missing, stopped or half-started: nobody ever writes to it, so a fresh copy is
        // always equivalent and simpler than recovering the old one.
        self.remove_reference(&golden.id).await?;
        let t0 = Instant::now();
        make_dir(&inst, 0o711)?;
        let src = golden.dir.join("data");
        let (method, owner) = (self.copy, self.run_as.clone());
        tokio::task::spawn_blocking(move || copy::copy_tree(&src, &data, method, &owner))
            .await
            .map_err(|source| ProviderError::ForkTask {
                what: "copy task".into(),
                source,
            })??;
        if let Err(e) = self.start(&key, &inst).await {
            let _ = self.remove_reference(&golden.id).await;
            return Err(e);
        }
        tracing::info!(
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "reference backend started"
        );
        Ok(backend)
    }
}
