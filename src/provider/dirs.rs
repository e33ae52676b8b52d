//! Directories the providers make and flush: created with their mode, synced to disk.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use super::ProviderError;

/// Creates `dir` with `mode` (an existing directory is fine) and sets the mode.
pub fn make_dir(dir: &Path, mode: u32) -> Result<(), ProviderError> {
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => {
            return Err(ProviderError::io_at(format!("creating {}", dir.display()))(
                e,
            ))
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Flushes the filesystem holding `dir` (syncfs), best effort.
pub fn sync_dir(dir: &Path) {
    if let Ok(f) = fs::File::open(dir) {
        use std::os::unix::io::AsRawFd;
        if let Err(e) = nix::unistd::syncfs(f.as_raw_fd()) {
            tracing::warn!(dir = %dir.display(), error = %e, "syncfs failed");
        }
    }
}
