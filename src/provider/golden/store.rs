//! The files golden versions are kept in, the same for every provider that has versions
//! (`instance`: data dirs, `microvm`: VM snapshots). Under a provider's root:
//! `versions/<id>/` holds a built version (with [`META_FILE`]), `versions/active` names the
//! version new forks use, and `pins/<token>` (version, expiry) pins a token issued while a
//! version was active to it until its fork names it or the token ends. What a version's
//! directory holds besides its metadata, and how forks name their version, is the provider's.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::build::stop_leftover_server;
use super::live::{BuildReport, LiveSpec};
use crate::provider::dirs::{make_dir, sync_dir};
use crate::provider::ProviderError;

/// Directory of built versions, under the provider's root.
const VERSIONS_DIR: &str = "versions";
/// File (in [`VERSIONS_DIR`]) naming the active version.
const ACTIVE_FILE: &str = "active";
/// Metadata of a built version, in its directory.
pub const META_FILE: &str = "golden.json";
/// Directory of pins (one file per issued, not yet forked token), under the root.
const PINS_DIR: &str = "pins";

/// A golden version as the API shows it (and as a worker answers it to its fronts).
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Forks (token backends and warm-pool members) made from it that exist now.
    pub forks: u64,
    /// Schemas copied (live builds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<String>,
    /// Tables left out (live builds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_tables: Vec<String>,
    /// What masking and sampling did (live builds).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub report: serde_json::Value,
    /// On a front over workers: the workers that have it ready (`active` and `forks` are
    /// then of the whole fleet: active everywhere, forks summed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerVersion>,
}

/// A golden version on one worker of a front (`remote.urls`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerVersion {
    /// Position in `remote.urls`.
    pub worker: usize,
    /// Its URL.
    pub url: String,
    /// Whether the worker's new forks copy it.
    pub active: bool,
    /// Its forks there now.
    pub forks: u64,
}

impl GoldenInfo {
    /// A golden built from the SQL file (`source` says which).
    pub fn sql(id: &str, created_at: String, source: &str, active: bool, forks: u64) -> Self {
        GoldenInfo {
            id: id.to_string(),
            kind: "sql".into(),
            created_at,
            source: source.into(),
            active,
            forks,
            schemas: Vec::new(),
            exclude_tables: Vec::new(),
            report: serde_json::Value::Null,
            workers: Vec::new(),
        }
    }

    /// A version built from a live database, from its stored metadata.
    pub fn live(id: String, meta: Meta, active: bool, forks: u64) -> Self {
        GoldenInfo {
            id,
            kind: "live".into(),
            created_at: meta.created_at,
            source: meta.source,
            active,
            forks,
            schemas: meta.schemas,
            exclude_tables: meta.exclude_tables,
            report: meta.report,
            workers: Vec::new(),
        }
    }
}

/// Stored with a built version: where it came from, never with credentials.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    id: String,
    created_at: String,
    source: String,
    schemas: Vec<String>,
    exclude_tables: Vec<String>,
    report: serde_json::Value,
}

impl Meta {
    /// The metadata of version `id`, built now from `spec`.
    pub fn new(id: &str, spec: &LiveSpec, report: Option<&BuildReport>) -> Meta {
        Meta {
            id: id.to_string(),
            created_at: crate::rfc3339::now(),
            source: spec.source.describe(),
            schemas: spec.schemas.clone(),
            exclude_tables: spec.exclude_tables.clone(),
            report: report
                .and_then(|r| serde_json::to_value(r).ok())
                .unwrap_or_default(),
        }
    }

    /// Writes it into a version's directory.
    pub fn write(&self, dir: &Path) -> Result<(), ProviderError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(ProviderError::GoldenMeta)?;
        fs::write(dir.join(META_FILE), bytes)?;
        Ok(())
    }

    /// Reads it from a version's directory (None: missing or unreadable).
    pub fn read(dir: &Path) -> Option<Meta> {
        fs::read(dir.join(META_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }
}

/// Whether `id` may name a version or a token (a single plain path component).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// `<root>/versions`.
pub fn versions_dir(root: &Path) -> PathBuf {
    root.join(VERSIONS_DIR)
}

/// Creates `<root>/versions` if needed and returns it.
pub fn make_versions_dir(root: &Path) -> Result<PathBuf, ProviderError> {
    let vdir = versions_dir(root);
    make_dir(&vdir, 0o711)?;
    Ok(vdir)
}

/// The id `versions/active` names, if it is a valid one (whether it is finished is the
/// provider's to check).
pub fn read_active(root: &Path) -> Option<String> {
    let named = fs::read_to_string(versions_dir(root).join(ACTIVE_FILE)).ok()?;
    let id = named.trim();
    valid_id(id).then(|| id.to_string())
}

/// Names `id` in `versions/active` (written aside, then renamed, then synced).
pub fn write_active(root: &Path, id: &str) -> Result<(), ProviderError> {
    let vdir = make_versions_dir(root)?;
    let tmp = vdir.join(format!("{ACTIVE_FILE}.tmp"));
    fs::write(&tmp, format!("{id}\n"))?;
    fs::rename(&tmp, vdir.join(ACTIVE_FILE))?;
    sync_dir(&vdir);
    Ok(())
}

/// Removes what builds interrupted by a dead gateway left (call at start, before any build
/// can run): their directories start with a dot, and may hold a server still running.
pub fn remove_unfinished(root: &Path) {
    let Ok(rd) = fs::read_dir(versions_dir(root)) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            stop_leftover_server(&e.path());
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The directory a build of `id` fills before it is renamed to `versions/<id>`.
pub fn building_dir(vdir: &Path, id: &str) -> PathBuf {
    vdir.join(format!(".{id}.building"))
}

/// Built versions on disk (valid names, directories): (id, dir), in name order (by time).
pub fn built(root: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = fs::read_dir(versions_dir(root))
        .map(|rd| {
            rd.flatten()
                .map(|e| (e.file_name().to_string_lossy().to_string(), e.path()))
                .filter(|(n, p)| valid_id(n) && p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `v20250102T030405-1a2b3c`: sorts by time, unique enough for one root.
pub fn new_id() -> String {
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

/// The modification time of `path`, RFC 3339 (empty if unknown).
pub fn modified(path: &Path) -> String {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .map(|t| crate::rfc3339::format(t.into()))
        .unwrap_or_default()
}

fn pin_path(root: &Path, token: &str) -> Result<PathBuf, ProviderError> {
    if !valid_id(token) {
        return Err(ProviderError::Other(format!("invalid token id {token:?}")));
    }
    Ok(root.join(PINS_DIR).join(token))
}

/// The version `token` is pinned to, if any.
pub fn read_pin(root: &Path, token: &str) -> Option<String> {
    let text = fs::read_to_string(pin_path(root, token).ok()?).ok()?;
    text.lines().next().map(str::to_string)
}

/// Pins `token` (expiring at `expires_at`, RFC 3339) to version `id`. Call under the
/// provider's versions gate, so that no switch or collection comes between.
pub fn write_pin(
    root: &Path,
    token: &str,
    id: &str,
    expires_at: &str,
) -> Result<(), ProviderError> {
    let path = pin_path(root, token)?;
    make_dir(&root.join(PINS_DIR), 0o700)?;
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, format!("{id}\n{expires_at}\n"))?;
    fs::rename(&tmp, &path)?;
    Ok(())
}

/// Removes a token's pin; true if there was one.
pub fn remove_pin(root: &Path, token: &str) -> Result<bool, ProviderError> {
    match fs::remove_file(pin_path(root, token)?) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Versions named by pins whose token has not expired; expired pins (a token that ended
/// while no gateway ran) are removed on the way.
pub fn pinned_versions(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Ok(rd) = fs::read_dir(root.join(PINS_DIR)) else {
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

/// The version a backend's directory names in its `file` (None: a backend of a gateway
/// before versions, or no such directory).
pub fn named_version(dir: &Path, file: &str) -> Option<String> {
    fs::read_to_string(dir.join(file))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// How many backends (dirs under `dir`) name each version; `version_of` reads a backend
/// dir's version, and one that names none (made by an older gateway) counts as `base`.
pub fn fork_counts(
    dir: &Path,
    version_of: impl Fn(&Path) -> Option<String>,
    base: &str,
) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let path = e.path();
            if !path.is_dir() {
                continue;
            }
            let id = version_of(&path).unwrap_or_else(|| base.to_string());
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

/// Finishes a build made in `tmp`: its metadata written, then renamed into `vdir` as `id`
/// and the rename synced (a version is whole or absent), and counted.
pub fn publish_build(
    vdir: &Path,
    tmp: &Path,
    id: &str,
    spec: &LiveSpec,
    report: Option<&BuildReport>,
) -> Result<(), ProviderError> {
    Meta::new(id, spec, report).write(tmp)?;
    fs::rename(tmp, vdir.join(id))?;
    sync_dir(vdir);
    metrics::counter!("sandpit_golden_builds_total").increment(1);
    Ok(())
}
