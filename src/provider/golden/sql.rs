//! The golden of the SQL file: found, or built beside the golden it replaces and renamed
//! into place only when complete; when it cannot be built, the one it replaces keeps serving.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::fcntl::{Flock, FlockArg};

use super::build::{build, golden_name, stop_leftover_server};
use super::{GoldenCtx, Load, READY_MARKER};
use crate::provider::dirs::sync_dir;
use crate::provider::ProviderError;

/// File under the provider root naming the golden built from the SQL file that served last,
/// so that a failed build of a changed SQL file can fall back to it.
const BASE_FILE: &str = "golden.base";

/// What [`ensure`] found or did.
#[derive(Debug)]
pub struct Ensured {
    /// Directory of the golden to serve (its data dir is `<dir>/data`).
    pub dir: PathBuf,
    /// Whether it was built now.
    pub built: bool,
    /// Why the golden of the current SQL file could not be built, when `dir` is the previous
    /// golden, kept serving instead.
    pub failed: Option<ProviderError>,
}

/// Makes sure the golden of the current SQL file exists under `ctx.root`, building it if
/// needed, beside the previous one: a new golden is built in a staging directory and renamed
/// into place only when complete. If it cannot be built (a typo in the new SQL), the previous
/// golden is returned with the error, so the service goes on as before; only when there is
/// none is the error returned. Older goldens are never removed here: forks and pins may
/// still name them (see [`super::versions::collect`]).
pub async fn ensure(ctx: &GoldenCtx<'_>) -> Result<Ensured, ProviderError> {
    // One builder at a time per root, across processes (and across providers in one process).
    let lock_path = ctx.root.join("golden.lock");
    let _lock = tokio::task::spawn_blocking(move || -> Result<Flock<fs::File>, ProviderError> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| ProviderError::GoldenIo {
            what: format!("locking {}", lock_path.display()),
            source: e.into(),
        })
    })
    .await
    .map_err(|source| ProviderError::Task {
        what: "lock task".into(),
        source,
    })??;

    remove_interrupted_builds(ctx.root);
    match ensure_current(ctx).await {
        Ok((dir, built)) => {
            record_base(ctx.root, &dir);
            Ok(Ensured {
                dir,
                built,
                failed: None,
            })
        }
        Err(e) => match previous(ctx.root, ctx.bins.major) {
            Some(dir) => Ok(Ensured {
                dir,
                built: false,
                failed: Some(e),
            }),
            None => Err(e),
        },
    }
}

/// The golden of the current SQL bytes: found ready, or built now (call with the build lock).
async fn ensure_current(ctx: &GoldenCtx<'_>) -> Result<(PathBuf, bool), ProviderError> {
    let sql = fs::read(ctx.sql_path).map_err(ProviderError::golden_io(format!(
        "reading golden SQL {}",
        ctx.sql_path.display()
    )))?;
    let name = golden_name(&sql, ctx.bins.major);
    let dir = ctx.root.join(&name);
    if is_ready(&dir) {
        tracing::debug!(golden = %dir.display(), "golden is up to date");
        return Ok((dir, false));
    }
    if dir.exists() {
        tracing::warn!(golden = %dir.display(), "removing half-built golden");
        fs::remove_dir_all(&dir)?;
    }
    let tmp = ctx
        .root
        .join(format!("{name}.building-{}", std::process::id()));
    let started = Instant::now();
    tracing::info!(sql = %ctx.sql_path.display(), "building golden snapshot (first start or golden SQL changed)");
    match build(ctx, &tmp, Load::Sql(ctx.sql_path)).await {
        Ok(_) => {
            fs::rename(&tmp, &dir)?;
            sync_dir(ctx.root);
            tracing::info!(golden = %dir.display(), elapsed_ms = started.elapsed().as_millis() as u64, "golden built");
            Ok((dir, true))
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Whether `dir` holds a finished golden.
pub(crate) fn is_ready(dir: &Path) -> bool {
    dir.join(READY_MARKER).is_file() && dir.join("data").is_dir()
}

/// Whether `name` is the directory name of a golden built from a SQL file.
pub(crate) fn is_sql_golden_name(name: &str) -> bool {
    name.strip_prefix("golden-")
        .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Removes the staging directories of builds that did not finish (we hold the build lock, so
/// none is in progress).
fn remove_interrupted_builds(root: &Path) {
    let Ok(rd) = fs::read_dir(root) else { return };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        if n.starts_with("golden-") && n.contains(".building-") && e.path().is_dir() {
            tracing::info!(dir = %e.path().display(), "removing an interrupted golden build");
            stop_leftover_server(&e.path());
            if let Err(err) = fs::remove_dir_all(e.path()) {
                tracing::warn!(dir = %e.path().display(), error = %err, "could not remove an interrupted golden build");
            }
        }
    }
}

/// Remembers which golden built from the SQL file serves now.
fn record_base(root: &Path, dir: &Path) {
    let Some(name) = dir.file_name() else { return };
    let tmp = root.join(format!("{BASE_FILE}.tmp"));
    let written = fs::write(&tmp, format!("{}\n", name.to_string_lossy()))
        .and_then(|()| fs::rename(&tmp, root.join(BASE_FILE)));
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not record the golden in use");
    }
}

/// The golden built from the SQL file that served before, if it is still whole and runs on
/// these binaries: the one [`BASE_FILE`] names, else (data dirs of gateways that did not
/// record it kept only one) the newest finished one.
fn previous(root: &Path, major: u32) -> Option<PathBuf> {
    let usable = |dir: &Path| {
        is_ready(dir)
            && fs::read_to_string(dir.join("data").join("PG_VERSION"))
                .is_ok_and(|v| v.trim() == major.to_string())
    };
    let named = fs::read_to_string(root.join(BASE_FILE)).unwrap_or_default();
    let named = named.trim();
    if is_sql_golden_name(named) && usable(&root.join(named)) {
        return Some(root.join(named));
    }
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(root)
        .ok()?
        .flatten()
        .filter(|e| is_sql_golden_name(&e.file_name().to_string_lossy()) && usable(&e.path()))
        .filter_map(|e| {
            let t = fs::metadata(e.path().join(READY_MARKER))
                .and_then(|m| m.modified())
                .ok()?;
            Some((t, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished golden whose ready marker is `age_s` seconds old.
    fn fake_golden(root: &Path, name: &str, major: &str, age_s: u64) -> PathBuf {
        let dir = root.join(name);
        fs::create_dir_all(dir.join("data")).unwrap();
        fs::write(dir.join("data").join("PG_VERSION"), format!("{major}\n")).unwrap();
        let marker = fs::File::create(dir.join(READY_MARKER)).unwrap();
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age_s);
        marker.set_modified(when).unwrap();
        dir
    }

    #[test]
    fn the_previous_golden_is_the_recorded_one_else_the_newest_that_runs_here() {
        let root = std::env::temp_dir().join(format!("sandpit-prev-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        assert_eq!(previous(&root, 15), None, "nothing built yet");
        let a = fake_golden(&root, "golden-00000000000000aa", "15", 300);
        let b = fake_golden(&root, "golden-00000000000000bb", "15", 200);
        fake_golden(&root, "golden-00000000000000cc", "14", 100);
        fs::create_dir_all(root.join("golden-00000000000000dd.building-1/data")).unwrap();
        // No record (data dirs of older gateways): the newest finished one of this major.
        assert_eq!(previous(&root, 15), Some(b.clone()));
        record_base(&root, &a);
        assert_eq!(previous(&root, 15), Some(a.clone()));
        // A record naming a golden that is gone or half-built falls back to the newest.
        fs::remove_file(a.join(READY_MARKER)).unwrap();
        assert_eq!(previous(&root, 15), Some(b));
        assert_eq!(
            previous(&root, 16),
            None,
            "no golden runs on other binaries"
        );
        remove_interrupted_builds(&root);
        assert!(!root.join("golden-00000000000000dd.building-1").exists());
        assert!(root.join("golden-00000000000000cc").exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn sql_golden_names() {
        assert!(is_sql_golden_name("golden-0123456789abcdef"));
        assert!(!is_sql_golden_name("golden-"));
        assert!(!is_sql_golden_name("golden-0123.building-5"));
        assert!(!is_sql_golden_name("v20250102T030405-1a2b3c"));
        assert!(!is_sql_golden_name("golden.base"));
    }
}
