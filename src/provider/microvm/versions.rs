//! Golden versions of the `microvm` provider: the snapshot built from the SQL file is the
//! base version (`goldens/golden-<hash>/`); snapshots built from a live database live in
//! `versions/<id>/` (memory file, device state, disk, metadata). Which one new forks restore
//! from, pins of issued tokens and the collection of unused versions work as for the
//! `instance` provider ([`golden::versions`]); every clone names its version in its
//! [`GOLDEN_FILE`], and the review's reference of a clone is restored from that version.
//!
//! [`golden::versions`]: crate::provider::golden::versions

use std::path::Path;

use super::golden::{self, Snapshot, GOLDENS_DIR};
use super::{qemu, MicrovmProvider, GOLDEN_FILE};
use crate::provider::golden::live::{BuildReport, LiveSpec};
use crate::provider::golden::store;
use crate::provider::golden::versions::{self as shared, Keeper, Versions};
use crate::provider::{BoxFuture, ProviderError};

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
    /// The version `versions/active` names if it is a finished one of this VM shape, else
    /// the base.
    pub(super) fn active_at_start(&self) -> Snapshot {
        store::read_active(&self.cfg.root)
            .and_then(|id| shared::find_golden(self, &id).ok())
            .unwrap_or_else(|| self.versions.base().clone())
    }
}

impl Keeper for MicrovmProvider {
    type Golden = Snapshot;
    const KIND: &'static str = "microvm golden";
    const GOLDEN_FILE: &'static str = GOLDEN_FILE;

    fn version_state(&self) -> &Versions<Snapshot> {
        &self.versions
    }

    /// A base of an earlier SQL file (clones made before it changed still name it), or a
    /// built version of this VM shape.
    fn find_other(&self, id: &str) -> Option<Snapshot> {
        let base_dir = self.cfg.root.join(GOLDENS_DIR).join(id);
        if id.starts_with("golden-") && golden::base_ready(&base_dir) {
            return Some(Snapshot::at(id, &base_dir, &self.versions.base().psql));
        }
        let dir = store::versions_dir(&self.cfg.root).join(id);
        golden::version_ready(&dir, &self.shape)
            .then(|| Snapshot::at(id, &dir, &self.versions.base().psql))
    }

    /// Token VMs and warm-pool members alike.
    fn backends_dir(&self) -> &Path {
        &self.vms
    }

    fn sql_created(&self, id: &str) -> String {
        store::modified(&self.cfg.root.join(GOLDENS_DIR).join(id))
    }

    fn built_ready(&self, dir: &Path) -> bool {
        golden::version_ready(dir, &self.shape)
    }

    /// In a freshly booted golden VM.
    fn build_into<'a>(
        &'a self,
        tmp: &'a Path,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<Option<BuildReport>, ProviderError>> {
        Box::pin(async move {
            golden::build_live(&self.cfg, &self.image, tmp, spec)
                .await
                .map(Some)
        })
    }

    fn remove_reference<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(MicrovmProvider::remove_reference(self, id))
    }
}
