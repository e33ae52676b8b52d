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

use serde::{Deserialize, Serialize};

use super::golden::{self, GoldenCtx, READY_MARKER};
use super::golden_build::LiveSpec;
use super::golden_sql;
use super::instance::{make_dir, validate_handle, InstanceProvider};
use super::ProviderError;

/// Directory of built versions, under the provider's real root.
const VERSIONS_DIR: &str = "versions";
/// File (in [`VERSIONS_DIR`]) naming the active version.
const ACTIVE_FILE: &str = "active";
/// Metadata of a built version, in its directory.
const META_FILE: &str = "golden.json";
/// Directory of pins (one file per issued, not yet forked token), under the real root.
const PINS_DIR: &str = "pins";
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

/// Stored with a built version: where it came from, never with credentials.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    id: String,
    created_at: String,
    source: String,
    schemas: Vec<String>,
    exclude_tables: Vec<String>,
    report: serde_json::Value,
}

/// A golden version as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct GoldenInfo {
    /// Version id.
    pub id: String,
    /// "sql" (built from the configured SQL file) or "live" (from a live database).
    pub kind: String,
    /// When it was built, RFC 3339 (the directory's time for the SQL golden).
    pub created_at: String,
    /// The SQL file name, or the source as `postgresql://user@host:port/db` (no password).
    pub source: String,
    /// Whether new forks copy it.
    pub active: bool,
    /// Instances (token backends and warm-pool members) copied from it that exist now.
    pub forks: u64,
    /// Schemas copied (live builds).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<String>,
    /// Tables left out (live builds).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exclude_tables: Vec<String>,
    /// What masking and sampling did (live builds).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub report: serde_json::Value,
}

fn versions_dir(root: &Path) -> PathBuf {
    root.join(VERSIONS_DIR)
}

fn ready(dir: &Path) -> bool {
    golden_sql::is_ready(dir)
}

/// The version named in `versions/active` if it is a finished built version, else the base.
pub fn active_at_start(root: &Path, base: &Golden) -> Golden {
    let named = fs::read_to_string(versions_dir(root).join(ACTIVE_FILE)).unwrap_or_default();
    let id = named.trim();
    if validate_handle(id).is_ok() {
        let dir = versions_dir(root).join(id);
        if ready(&dir) {
            return Golden {
                id: id.to_string(),
                dir,
            };
        }
    }
    base.clone()
}

/// Removes what builds interrupted by a dead gateway left (called at start, before any
/// build can run).
pub fn remove_unfinished(root: &Path) {
    let Ok(rd) = fs::read_dir(versions_dir(root)) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The version an instance dir was copied from (None for instances older than versions).
pub fn instance_golden(inst: &Path) -> Option<String> {
    fs::read_to_string(inst.join(GOLDEN_FILE))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `v20250102T030405-1a2b3c`: sorts by time, unique enough for one root.
fn new_id() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "v{:04}{:02}{:02}T{:02}{:02}{:02}-{}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        hex::encode(rand::random::<[u8; 3]>())
    )
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
            versions_dir(&self.real_root).join(id)
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

    fn pin_path(&self, token: &str) -> Result<PathBuf, ProviderError> {
        validate_handle(token)?;
        Ok(self.real_root.join(PINS_DIR).join(token))
    }

    fn read_pin(&self, token: &str) -> Option<String> {
        let text = fs::read_to_string(self.pin_path(token).ok()?).ok()?;
        text.lines().next().map(str::to_string)
    }

    /// Pins the active version for `token` (issued, expiring at `expires_at`, RFC 3339).
    pub(super) async fn pin_version(
        &self,
        token: &str,
        expires_at: &str,
    ) -> Result<String, ProviderError> {
        let path = self.pin_path(token)?;
        // Under the gate: a switch or a collection cannot come between reading and pinning.
        let _gate = self.versions_gate.read().await;
        let active = self.active_golden_now();
        make_dir(&self.real_root.join(PINS_DIR), 0o700)?;
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, format!("{}\n{expires_at}\n", active.id))?;
        fs::rename(&tmp, &path)?;
        Ok(active.id)
    }

    /// Removes a token's pin; true if there was one.
    pub(super) fn unpin_version(&self, token: &str) -> Result<bool, ProviderError> {
        match fs::remove_file(self.pin_path(token)?) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Versions named by pins whose token has not expired; expired pins (a token that ended
    /// while no gateway ran) are removed on the way.
    fn pinned_versions(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let Ok(rd) = fs::read_dir(self.real_root.join(PINS_DIR)) else {
            return out;
        };
        let now = time::OffsetDateTime::now_utc();
        for e in rd.flatten() {
            let text = fs::read_to_string(e.path()).unwrap_or_default();
            let mut lines = text.lines();
            let (Some(version), Some(expires)) = (lines.next(), lines.next()) else {
                continue; // being written
            };
            let expired = crate::rfc3339::parse(expires).is_some_and(|t| t < now);
            if expired {
                let _ = fs::remove_file(e.path());
            } else {
                out.insert(version.to_string());
            }
        }
        out
    }

    /// How many instances name each version (instances of older gateways count as base).
    fn fork_counts(&self) -> std::collections::BTreeMap<String, u64> {
        let mut counts = std::collections::BTreeMap::new();
        if let Ok(rd) = fs::read_dir(&self.instances) {
            for e in rd.flatten() {
                if !e.path().is_dir() {
                    continue;
                }
                let id = instance_golden(&e.path()).unwrap_or_else(|| self.base.id.clone());
                *counts.entry(id).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Every version, oldest first.
    pub(super) async fn list_goldens(&self) -> Result<Vec<GoldenInfo>, ProviderError> {
        let _gate = self.versions_gate.read().await;
        let active = self.active_golden_now().id;
        let counts = self.fork_counts();
        let created = |dir: &Path| {
            fs::metadata(dir.join(READY_MARKER))
                .and_then(|m| m.modified())
                .ok()
                .map(|t| crate::rfc3339::format(t.into()))
                .unwrap_or_default()
        };
        let mut out = vec![GoldenInfo {
            id: self.base.id.clone(),
            kind: "sql".into(),
            created_at: created(&self.base.dir),
            source: "golden SQL file".into(),
            active: active == self.base.id,
            forks: counts.get(&self.base.id).copied().unwrap_or(0),
            schemas: Vec::new(),
            exclude_tables: Vec::new(),
            report: serde_json::Value::Null,
        }];
        for (id, dir) in self.replaced_sql_goldens() {
            out.push(GoldenInfo {
                active: active == id,
                forks: counts.get(&id).copied().unwrap_or(0),
                kind: "sql".into(),
                created_at: created(&dir),
                source: "golden SQL file before it changed (kept while forks or pins name it)"
                    .into(),
                schemas: Vec::new(),
                exclude_tables: Vec::new(),
                report: serde_json::Value::Null,
                id,
            });
        }
        let mut built = Vec::new();
        if let Ok(rd) = fs::read_dir(versions_dir(&self.real_root)) {
            for e in rd.flatten() {
                let id = e.file_name().to_string_lossy().to_string();
                if validate_handle(&id).is_err() || !ready(&e.path()) {
                    continue;
                }
                let meta: Option<Meta> = fs::read(e.path().join(META_FILE))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
                let Some(meta) = meta else { continue };
                built.push(GoldenInfo {
                    active: active == id,
                    forks: counts.get(&id).copied().unwrap_or(0),
                    id,
                    kind: "live".into(),
                    created_at: meta.created_at,
                    source: meta.source,
                    schemas: meta.schemas,
                    exclude_tables: meta.exclude_tables,
                    report: meta.report,
                });
            }
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
        let vdir = versions_dir(&self.real_root);
        make_dir(&vdir, 0o711)?;
        let id = new_id();
        let tmp = vdir.join(format!(".{id}.building"));
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
        let meta = Meta {
            id: id.clone(),
            created_at: crate::rfc3339::now(),
            source: spec.source.describe(),
            schemas: spec.schemas.clone(),
            exclude_tables: spec.exclude_tables.clone(),
            report: serde_json::to_value(&report).unwrap_or_default(),
        };
        let bytes = serde_json::to_vec_pretty(&meta)
            .map_err(|e| ProviderError::Golden(format!("golden metadata: {e}")))?;
        fs::write(tmp.join(META_FILE), bytes)?;
        fs::rename(&tmp, vdir.join(&id))?;
        golden::sync_dir(&vdir);
        tracing::info!(golden = %id, elapsed_ms = started.elapsed().as_millis() as u64, "golden built from a live database");
        metrics::counter!("sandpit_golden_builds_total").increment(1);
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
            let vdir = versions_dir(&self.real_root);
            make_dir(&vdir, 0o711)?;
            let tmp = vdir.join(format!("{ACTIVE_FILE}.tmp"));
            fs::write(&tmp, format!("{}\n", golden.id))?;
            fs::rename(&tmp, vdir.join(ACTIVE_FILE))?;
            golden::sync_dir(&vdir);
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
        let pinned = self.pinned_versions();
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
        let vdir = versions_dir(&self.real_root);
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
