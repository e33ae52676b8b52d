//! Golden versions of the `instance` provider. The golden built from the SQL file is the
//! base version (its id is its directory name, `golden-<hash>`); goldens built from a live
//! database live in `<root>/versions/<id>/`. `versions/active` names the one new forks copy;
//! every instance names its own in `golden-version`. A token issued while a version is active
//! is pinned to it (`<root>/pins/<token>`: version and expiry) until its fork names it or
//! the token ends. A built version that is not active and that no instance or live pin names
//! any more is removed. So is a golden built from an earlier content of the SQL file (it is
//! kept beside the current one, and reviews of its forks compare against it, until then).
//! What is shared with `microvm` is in [`golden::versions`].

use std::fs;
use std::path::{Path, PathBuf};

use super::InstanceProvider;
use crate::provider::golden::live::{BuildReport, LiveSpec};
use crate::provider::golden::store;
use crate::provider::golden::versions::{Keeper, Version, Versions};
use crate::provider::golden::{self, build, sql, GoldenCtx, READY_MARKER};
use crate::provider::{BoxFuture, ProviderError};

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

impl Version for Golden {
    fn id(&self) -> &str {
        &self.id
    }
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

/// The versions under `root` at start, `versions/active` in use if it names a finished
/// built version, else the base. Removes what builds interrupted by a dead gateway left
/// first (before any build can run).
pub(super) fn at_start(root: &Path, base: Golden) -> Versions<Golden> {
    store::remove_unfinished(root);
    let mut active = base.clone();
    if let Some(id) = store::read_active(root) {
        let dir = store::versions_dir(root).join(&id);
        if sql::is_ready(&dir) {
            active = Golden { id, dir };
        }
    }
    Versions::new(root.to_path_buf(), base, active)
}

impl Keeper for InstanceProvider {
    type Golden = Golden;
    const KIND: &'static str = "golden";
    const GOLDEN_FILE: &'static str = GOLDEN_FILE;

    fn version_state(&self) -> &Versions<Golden> {
        &self.versions
    }

    fn find_other(&self, id: &str) -> Option<Golden> {
        // A golden of the SQL file as it was before it changed, kept for its forks.
        let dir = if sql::is_sql_golden_name(id) {
            self.real_root.join(id)
        } else {
            store::versions_dir(&self.real_root).join(id)
        };
        sql::is_ready(&dir).then(|| Golden {
            id: id.to_string(),
            dir,
        })
    }

    fn backends_dir(&self) -> &Path {
        &self.instances
    }

    fn sql_created(&self, id: &str) -> String {
        let dir = if id == self.versions.base().id {
            self.versions.base().dir.clone()
        } else {
            self.real_root.join(id)
        };
        store::modified(&dir.join(READY_MARKER))
    }

    fn built_ready(&self, dir: &Path) -> bool {
        sql::is_ready(dir)
    }

    fn build_into<'a>(
        &'a self,
        tmp: &'a Path,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<Option<BuildReport>, ProviderError>> {
        Box::pin(async move {
            let ctx = GoldenCtx {
                bins: &self.bins,
                run_as: &self.run_as,
                netns: self.netns,
                root: &self.real_root,
                sql_path: Path::new(""),
                gateway_user: &self.gateway_user,
                max_connections: self.max_connections,
            };
            build::build(&ctx, tmp, golden::Load::Live(spec)).await
        })
    }

    fn remove_reference<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(InstanceProvider::remove_reference(self, id))
    }

    /// Goldens built from earlier contents of the SQL file (not the base), oldest first.
    fn replaced_sql_goldens(&self) -> Vec<(String, PathBuf)> {
        let mut out: Vec<(String, PathBuf)> = fs::read_dir(&self.real_root)
            .map(|rd| {
                rd.flatten()
                    .map(|e| (e.file_name().to_string_lossy().to_string(), e.path()))
                    .filter(|(n, p)| {
                        sql::is_sql_golden_name(n) && *n != self.versions.base().id && p.is_dir()
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
}
