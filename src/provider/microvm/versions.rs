//! Golden versions of the `microvm` provider: the snapshot built from the SQL file is the
//! base version (`goldens/golden-<hash>/`); snapshots built from a live database live in
//! `versions/<id>/` (memory file, device state, disk, metadata). Which one new forks restore
//! from, pins of issued tokens and the collection of unused versions work as for the
//! `instance` provider ([`version_store`]); every clone names its version in its
//! [`GOLDEN_FILE`], and the review's reference of a clone is restored from that version.
//!
//! [`version_store`]: crate::provider::version_store

use std::path::Path;
use std::time::Instant;

use super::golden::{self, Snapshot, GOLDENS_DIR};
use super::{qemu, MicrovmProvider, GOLDEN_FILE};
use crate::provider::golden_build::LiveSpec;
use crate::provider::version_store::{self as store, GoldenInfo, Meta};
use crate::provider::{BackendTag, ProviderError};

/// The version a clone's dir names (None: a clone of a gateway before versions, or no dir).
pub(super) fn clone_golden(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(GOLDEN_FILE))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Kills the VMs of builds a dead gateway left running, then removes their dirs (at start).
pub(super) async fn remove_unfinished(root: &Path) {
    if let Ok(rd) = std::fs::read_dir(store::versions_dir(root)) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                qemu::kill(&e.path().join(golden::STAGE_DIR)).await;
                qemu::kill(&e.path()).await;
            }
        }
    }
    store::remove_unfinished(root);
}

impl MicrovmProvider {
    /// The snapshot new forks restore from.
    pub(super) fn active_now(&self) -> Snapshot {
        self.active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The version `versions/active` names if it is a finished one of this VM shape, else
    /// the base.
    pub(super) fn active_at_start(&self) -> Snapshot {
        store::read_active(&self.cfg.root)
            .and_then(|id| self.find_golden(&id).ok())
            .unwrap_or_else(|| self.base.clone())
    }

    /// A finished snapshot by id: the base, a base of an earlier SQL file (clones made before
    /// it changed still name it), or a built version of this VM shape.
    pub(super) fn find_golden(&self, id: &str) -> Result<Snapshot, ProviderError> {
        if id == self.base.id {
            return Ok(self.base.clone());
        }
        let gone = || ProviderError::NotFound(format!("golden {id}"));
        if !store::valid_id(id) {
            return Err(gone());
        }
        let base_dir = self.cfg.root.join(GOLDENS_DIR).join(id);
        if id.starts_with("golden-") && golden::base_ready(&base_dir) {
            return Ok(Snapshot::at(id, &base_dir, &self.base.psql));
        }
        let dir = store::versions_dir(&self.cfg.root).join(id);
        if golden::version_ready(&dir, &self.shape) {
            return Ok(Snapshot::at(id, &dir, &self.base.psql));
        }
        Err(gone())
    }

    /// The snapshot a fork for `tag` restores: its pin while that version is on disk, else
    /// the active one. Call with the versions gate held.
    pub(super) fn golden_for(&self, tag: &BackendTag) -> Snapshot {
        let pinned = tag
            .golden
            .clone()
            .or_else(|| store::read_pin(&self.cfg.root, &tag.token_id));
        match pinned.map(|id| self.find_golden(&id)) {
            Some(Ok(g)) => g,
            Some(Err(_)) => {
                tracing::warn!(token = %tag.token_id, "pinned golden version is gone; restoring the active one");
                self.active_now()
            }
            None => self.active_now(),
        }
    }

    /// Pins the active version for `token` (issued, expiring at `expires_at`, RFC 3339).
    pub(super) async fn pin_version(
        &self,
        token: &str,
        expires_at: &str,
    ) -> Result<String, ProviderError> {
        // Under the gate: a switch or a collection cannot come between reading and pinning.
        let _gate = self.versions_gate.read().await;
        let active = self.active_now();
        store::write_pin(&self.cfg.root, token, &active.id, expires_at)?;
        Ok(active.id)
    }

    /// How many clones (token VMs and warm-pool members) name each version.
    fn fork_counts(&self) -> std::collections::BTreeMap<String, u64> {
        store::fork_counts(&self.vms, clone_golden, &self.base.id)
    }

    /// Every version: the base, then built ones oldest first.
    pub(super) async fn list_goldens(&self) -> Result<Vec<GoldenInfo>, ProviderError> {
        let _gate = self.versions_gate.read().await;
        let active = self.active_now().id;
        let counts = self.fork_counts();
        let count = |id: &str| counts.get(id).copied().unwrap_or(0);
        let base_dir = self.cfg.root.join(GOLDENS_DIR).join(&self.base.id);
        let mut out = vec![GoldenInfo::sql(
            &self.base.id,
            store::modified(&base_dir),
            "golden SQL file",
            active == self.base.id,
            count(&self.base.id),
        )];
        for (id, dir) in store::built(&self.cfg.root) {
            if !golden::version_ready(&dir, &self.shape) {
                continue;
            }
            let Some(meta) = Meta::read(&dir) else {
                continue;
            };
            out.push(GoldenInfo::live(id.clone(), meta, active == id, count(&id)));
        }
        Ok(out)
    }

    /// Builds a new version from a live database in a freshly booted golden VM (not active
    /// until [`use_version`]).
    ///
    /// [`use_version`]: MicrovmProvider::use_version
    pub(super) async fn build_version(&self, spec: &LiveSpec) -> Result<GoldenInfo, ProviderError> {
        let _one = self.build_lock.lock().await;
        let vdir = store::make_versions_dir(&self.cfg.root)?;
        let id = store::new_id();
        let tmp = store::building_dir(&vdir, &id);
        let started = Instant::now();
        tracing::info!(golden = %id, source = %spec.source.describe(), "building a microvm golden from a live database");
        let report = match golden::build_live(&self.cfg, &self.image, &tmp, spec).await {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                tracing::warn!(golden = %id, error = %e, "golden build failed");
                return Err(e);
            }
        };
        store::publish_build(&vdir, &tmp, &id, spec, Some(&report))?;
        tracing::info!(golden = %id, elapsed_ms = started.elapsed().as_millis() as u64, "microvm golden built from a live database");
        self.list_goldens()
            .await?
            .into_iter()
            .find(|g| g.id == id)
            .ok_or_else(|| ProviderError::Golden(format!("golden {id} vanished after its build")))
    }

    /// Makes `id` the snapshot new forks restore; clones made before keep theirs.
    pub(super) async fn use_version(&self, id: &str) -> Result<GoldenInfo, ProviderError> {
        {
            let _gate = self.versions_gate.write().await;
            let golden = self.find_golden(id)?;
            store::write_active(&self.cfg.root, &golden.id)?;
            *self.active.write().unwrap_or_else(|p| p.into_inner()) = golden;
        }
        tracing::info!(golden = %id, "golden version in use for new forks");
        self.collect_versions().await;
        self.list_goldens()
            .await?
            .into_iter()
            .find(|g| g.id == id)
            .ok_or_else(|| ProviderError::NotFound(format!("golden {id}")))
    }

    /// Removes every built version that is not active and that no clone names and no live
    /// pin names, with its reference VM. Base goldens are kept.
    pub(super) async fn collect_versions(&self) {
        let _gate = self.versions_gate.write().await;
        let active = self.active_now().id;
        let counts = self.fork_counts();
        let pinned = store::pinned_versions(&self.cfg.root);
        for (id, dir) in store::built(&self.cfg.root) {
            if id == active || counts.contains_key(&id) || pinned.contains(&id) {
                continue;
            }
            if let Err(err) = self.remove_reference(&id).await {
                tracing::warn!(golden = %id, error = %err, "removing a reference failed");
            }
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => tracing::info!(golden = %id, "golden version removed: no fork uses it"),
                Err(err) => {
                    tracing::warn!(golden = %id, error = %err, "removing a golden version failed")
                }
            }
        }
    }
}
