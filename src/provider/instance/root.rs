//! The data root of the `instance` provider: making it reachable by the Postgres user
//! (with a fallback directory when it is not) and creating its directories.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::pg::user::{self, RunAs};
use crate::provider::dirs::make_dir;
use crate::provider::ProviderError;

/// Makes `root` a directory the Postgres user can traverse and returns its canonical path.
/// If an ancestor is closed to that user (e.g. under /root, or a 0700 tempdir), the real
/// directory is `/var/tmp/sandpit-<hash>` and `root` becomes a symlink to it.
pub(super) fn prepare_root(root: &Path, run_as: &RunAs) -> Result<PathBuf, ProviderError> {
    let name = root.file_name().ok_or_else(|| {
        ProviderError::Other(format!(
            "data root {} has no final component",
            root.display()
        ))
    })?;
    let parent = match root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent)?;
    let abs = fs::canonicalize(&parent)?.join(name);
    let real = match fs::symlink_metadata(&abs) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = fs::read_link(&abs)?;
            let target = if target.is_absolute() {
                target
            } else {
                abs.parent().unwrap_or(Path::new("/")).join(target)
            };
            // The fallback may have been cleaned (e.g. /var/tmp after a reboot): recreate it.
            if !target.exists() {
                make_owned_dir(&target)?;
            }
            fs::canonicalize(&abs)?
        }
        Ok(m) if m.is_dir() => {
            if m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o011 != 0o011 {
                fs::set_permissions(&abs, fs::Permissions::from_mode(0o711))?;
            }
            abs.clone()
        }
        Ok(_) => {
            return Err(ProviderError::Other(format!(
                "data root {} is not a directory",
                abs.display()
            )))
        }
        Err(_) if user::can_traverse(abs.parent().unwrap_or(Path::new("/")), run_as) => {
            make_dir(&abs, 0o711)?;
            abs.clone()
        }
        Err(_) => {
            let h = hex::encode(Sha256::digest(abs.as_os_str().as_encoded_bytes()));
            let fallback = PathBuf::from(format!("/var/tmp/sandpit-{}", &h[..12]));
            make_owned_dir(&fallback)?;
            std::os::unix::fs::symlink(&fallback, &abs)?;
            tracing::info!(root = %abs.display(), real = %fallback.display(),
                "data root is not reachable by the postgres user; using a fallback directory");
            fallback
        }
    };
    if !user::can_traverse(&real, run_as) {
        return Err(ProviderError::Other(format!(
            "postgres user {} cannot reach data root {}; choose a data dir outside private directories",
            run_as.name,
            real.display()
        )));
    }
    Ok(real)
}

/// Creates (or accepts) a 0711 directory we own; refuses a symlink or someone else's directory,
/// since the fallback lives in a world-writable place.
fn make_owned_dir(dir: &Path) -> Result<(), ProviderError> {
    make_dir_all_parent(dir)?;
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() => {}
        Ok(_) => {
            return Err(ProviderError::Other(format!(
                "{} exists and is not our directory",
                dir.display()
            )))
        }
        Err(_) => make_dir(dir, 0o711)?,
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o711))?;
    Ok(())
}

fn make_dir_all_parent(dir: &Path) -> Result<(), ProviderError> {
    if let Some(p) = dir.parent() {
        fs::create_dir_all(p)?;
    }
    Ok(())
}
