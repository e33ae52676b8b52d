//! Golden versions of the `instance` provider. The golden built from the SQL file is the
//! base version (its id is its directory name, `golden-<hash>`); goldens built from a live
//! database live in `<root>/versions/<id>/`. `versions/active` names the one new forks copy;
//! every instance names its own in `golden-version`. A token issued while a version is active
//! is pinned to it (`<root>/pins/<token>`: version and expiry) until its fork names it or
//! the token ends. A built version that is not active and that no instance or live pin names
//! any more is removed. So is a golden built from an earlier content of the SQL file (it is
//! kept beside the current one, and reviews of its forks compare against it, until then).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::golden::{self, GoldenCtx, READY_MARKER};
use super::golden_build::LiveSpec;
use super::golden_sql;
use super::instance::{validate_handle, InstanceProvider};
use super::version_store::{self as store, Meta};
use super::ProviderError;

pub use super::version_store::GoldenInfo;

/// File in an instance dir naming the golden version it was copied from.
pub(super) const GOLDEN_FILE: &str = "golden-version";

/// One golden version on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Golden {
    /// Version id.
    pub id: String,
    /// Its directory (the data dir is `<dir>/data`).
    pub dir: PathBuf,
}

impl Golden {
    /// The version built from the SQL file, in `dir`.
    pub fn base(dir: PathBuf) -> Golden {
        let id = dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        Golden { id, dir }
    }
}

fn ready(dir: &Path) -> bool {
    golden_sql::is_ready(dir)
}

/// The version named in `versions/active` if it is a finished built version, else the base.
pub fn active_at_start(root: &Path, base: &Golden) -> Golden {
    if let Some(id) = store::read_active(root) {
        let dir = store::versions_dir(root).join(&id);
        if ready(&dir) {
            return Golden { id, dir };
        }
    }
    base.clone()
}

/// Removes what builds interrupted by a dead gateway left (called at start, before any
/// build can run).
pub fn remove_unfinished(root: &Path) {
    store::remove_unfinished(root)
}

/// The version an instance dir was copied from (None for instances older than versions).
pub fn instance_golden(inst: &Path) -> Option<String> {
    fs::read_to_string(inst.join(GOLDEN_FILE))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

impl InstanceProvider {
    pub(super) fn active_golden_now(&self) -> Golden {
        self.active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A version by id (base or built), if it is on disk and finished.
    pub(super) fn find_golden(&self, id: &str) -> Result<Golden, ProviderError> {
        if id == self.base.id {
            return Ok(self.base.clone());
        }
        validate_handle(id).map_err(|_| ProviderError::NotFound(format!("golden {id}")))?;
        // A golden of the SQL file as it was before it changed, kept for its forks.
        let dir = if golden_sql::is_sql_golden_name(id) {
            self.real_root.join(id)
        } else {
            store::versions_dir(&self.real_root).join(id)
        };
        if ready(&dir) {
            Ok(Golden {
                id: id.to_string(),
                dir,
            })
        } else {
            Err(ProviderError::NotFound(format!("golden {id}")))
        }
    }

    /// The version a fork for `tag` copies: its pin while that version is on disk, else the
    /// active one. Call with the versions gate held.
    pub(super) fn golden_for(&self, tag: &super::BackendTag) -> Golden {
        let pinned = tag.golden.clone().or_else(|| self.read_pin(&tag.token_id));
        match pinned.map(|id| self.find_golden(&id)) {
            Some(Ok(g)) => g,
            Some(Err(_)) => {
                tracing::warn!(token = %tag.token_id, "pinned golden version is gone; forking the active one");
                self.active_golden_now()
            }
            None => self.active_golden_now(),
        }
    }

    fn read_pin(&self, token: &str) -> Option<String> {
        store::read_pin(&self.real_root, token)
    }

    /// Pins the active version for `token` (issued, expiring at `expires_at`, RFC 3339).
    pub(super) async fn pin_version(
        &self,
        token: &str,
        expires_at: &str,
    ) -> Result<String, ProviderError> {
        // Under the gate: a switch or a collection cannot come between reading and pinning.
        let _gate = self.versions_gate.read().await;
        let active = self.active_golden_now();
        store::write_pin(&self.real_root, token, &active.id, expires_at)?;
        Ok(active.id)
    }

    /// Removes a token's pin; true if there was one.
    pub(super) fn unpin_version(&self, token: &str) -> Result<bool, ProviderError> {
        store::remove_pin(&self.real_root, token)
    }

    /// How many instances name each version (instances of older gateways count as base).
    fn fork_counts(&self) -> std::collections::BTreeMap<String, u64> {
        store::fork_counts(&self.instances, instance_golden, &self.base.id)
    }

    /// Every version, oldest first.
    pub(super) async fn list_goldens(&self) -> Result<Vec<GoldenInfo>, ProviderError> {
        let _gate = self.versions_gate.read().await;
        let active = self.active_golden_now().id;
        let counts = self.fork_counts();
        let created = |dir: &Path| store::modified(&dir.join(READY_MARKER));
        let count = |id: &str| counts.get(id).copied().unwrap_or(0);
        let mut out = vec![GoldenInfo::sql(
            &self.base.id,
            created(&self.base.dir),
            "golden SQL file",
            active == self.base.id,
            count(&self.base.id),
        )];
        for (id, dir) in self.replaced_sql_goldens() {
            out.push(GoldenInfo::sql(
                &id,
                created(&dir),
                "golden SQL file before it changed (kept while forks or pins name it)",
                active == id,
                count(&id),
            ));
        }
        let mut built = Vec::new();
        for (id, dir) in store::built(&self.real_root) {
            if !ready(&dir) {
                continue;
            }
            let Some(meta) = Meta::read(&dir) else {
                continue;
            };
            built.push(GoldenInfo::live(id.clone(), meta, active == id, count(&id)));
        }
        built.sort_by(|a, b| a.id.cmp(&b.id));
        out.extend(built);
        Ok(out)
    }

    /// Builds a new version from a live database (not active until [`use_version`]).
    ///
    /// [`use_version`]: InstanceProvider::use_version
    pub(super) async fn build_version(&self, spec: &LiveSpec) -> Result<GoldenInfo, ProviderError> {
        let _one = self.build_lock.lock().await;
        let vdir = store::make_versions_dir(&self.real_root)?;
        let id = store::new_id();
        let tmp = store::building_dir(&vdir, &id);
        let ctx = GoldenCtx {
            bins: &self.bins,
            run_as: &self.run_as,
            netns: self.netns,
            root: &self.real_root,
            sql_path: Path::new(""),
            gateway_user: &self.gateway_user,
            max_connections: self.max_connections,
        };
        let started = Instant::now();
        tracing::info!(golden = %id, source = %spec.source.describe(), "building golden from a live database");
        let report = match golden::build(&ctx, &tmp, golden::Load::Live(spec)).await {
            Ok(r) => r,
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                tracing::warn!(golden = %id, error = %e, "golden build failed");
                return Err(e);
            }
        };
        store::publish_build(&vdir, &tmp, &id, spec, report.as_ref())?;
        tracing::info!(golden = %id, elapsed_ms = started.elapsed().as_millis() as u64, "golden built from a live database");
        self.list_goldens()
            .await?
            .into_iter()
            .find(|g| g.id == id)
            .ok_or_else(|| ProviderError::Golden(format!("golden {id} vanished after its build")))
    }

    /// Makes `id` the version new forks copy; forks made before keep theirs.
    pub(super) async fn use_version(&self, id: &str) -> Result<GoldenInfo, ProviderError> {
        {
            let _gate = self.versions_gate.write().await;
            let golden = self.find_golden(id)?;
            store::write_active(&self.real_root, &golden.id)?;
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

    /// Goldens built from earlier contents of the SQL file (not the base), oldest first.
    fn replaced_sql_goldens(&self) -> Vec<(String, PathBuf)> {
        let mut out: Vec<(String, PathBuf)> = fs::read_dir(&self.real_root)
            .map(|rd| {
                rd.flatten()
                    .map(|e| (e.file_name().to_string_lossy().to_string(), e.path()))
                    .filter(|(n, p)| {
                        golden_sql::is_sql_golden_name(n) && *n != self.base.id && p.is_dir()
                    })
                    .collect()
            })
            .unwrap_or_default();
        let built = |p: &Path| {
            fs::metadata(p.join(READY_MARKER))
                .and_then(|m| m.modified())
                .ok()
        };
        out.sort_by_key(|(_, p)| built(p));
        out
    }

    /// Removes every built version, and every golden of an earlier SQL file, that is not
    /// active and that no instance was copied from and no live pin names (with its reference
    /// backend). The base golden is kept: it is the configured one.
    pub(super) async fn collect_versions(&self) {
        let _gate = self.versions_gate.write().await;
        let active = self.active_golden_now().id;
        let counts = self.fork_counts();
        let pinned = store::pinned_versions(&self.real_root);
        for (name, dir) in self.replaced_sql_goldens() {
            if name == active || counts.contains_key(&name) || pinned.contains(&name) {
                continue;
            }
            if let Err(err) = self.remove_reference(&name).await {
                tracing::warn!(golden = %name, error = %err, "removing a reference failed");
            }
            match fs::remove_dir_all(&dir) {
                Ok(()) => tracing::info!(golden = %name,
                    "golden of an earlier golden SQL file removed: no fork or pin uses it"),
                Err(err) => {
                    tracing::warn!(golden = %name, error = %err, "removing an earlier golden failed")
                }
            }
        }
        let vdir = store::versions_dir(&self.real_root);
        let Ok(rd) = fs::read_dir(&vdir) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !e.path().is_dir()
                || name == active
                || counts.contains_key(&name)
                || pinned.contains(&name)
            {
                continue;
            }
            // A build in progress (leftovers of dead ones go at start).
            if name.starts_with('.') {
                continue;
            }
            if let Err(err) = self.remove_reference(&name).await {
                tracing::warn!(golden = %name, error = %err, "removing a reference failed");
            }
            match fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!(golden = %name, "golden version removed: no fork uses it"),
                Err(err) => {
                    tracing::warn!(golden = %name, error = %err, "removing a golden version failed")
                }
            }
        }
    }
}
