//! Private directories under the data dir: token records, statement logs, reviews and TLS
//! keys are nobody else's business, so their directories are 0700 whatever the umask, also
//! when an older version created them 0755. (The data dir itself stays 0711: the unprivileged
//! Postgres user must traverse it to reach `pg/`.)

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Mode of every directory made here.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// Creates `base` and `base/rel` (each directory on the way 0700) and makes `base` and every
/// directory below it down to `base/rel` 0700 if it existed already. Returns `base/rel`.
/// `rel` must be relative and plain (no `..`); anything else is an error.
pub fn private_dirs(base: &Path, rel: &Path) -> io::Result<PathBuf> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(base)?;
    make_private(base)?;
    let mut dir = base.to_path_buf();
    for c in rel.components() {
        let Component::Normal(name) = c else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", rel.display()),
            ));
        };
        dir.push(name);
        match fs::DirBuilder::new().mode(PRIVATE_DIR_MODE).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        make_private(&dir)?;
    }
    Ok(dir)
}

/// Sets 0700 on a directory (never through a symlink: one there is an error).
fn make_private(dir: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        ));
    }
    if meta.permissions().mode() & 0o7777 != PRIVATE_DIR_MODE {
        fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR_MODE))?;
    }
    Ok(())
}

/// Bytes free for an unprivileged writer on the filesystem holding `dir` (statvfs
/// `f_bavail`), or None when it cannot be read.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn creates_and_tightens_every_level() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("logs");
        // An older version's 0755 directory is tightened.
        fs::create_dir(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        let leaf = private_dirs(&base, Path::new("task/sub")).unwrap();
        assert_eq!(leaf, base.join("task/sub"));
        for p in [&base, &base.join("task"), &leaf] {
            assert_eq!(mode(p), 0o700, "{}", p.display());
        }
        // Idempotent, and a bare base works.
        private_dirs(&base, Path::new("task/sub")).unwrap();
        let fresh = tmp.path().join("a/b");
        assert_eq!(private_dirs(&fresh, Path::new("")).unwrap(), fresh);
        assert_eq!(mode(&fresh), 0o700);
    }

    #[test]
    fn refuses_escapes_and_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("reviews");
        assert!(private_dirs(&base, Path::new("../x")).is_err());
        assert!(private_dirs(&base, Path::new("/etc")).is_err());
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&outside, base.join("task")).unwrap();
        assert!(private_dirs(&base, Path::new("task")).is_err());
        assert_eq!(mode(&outside), 0o755, "the link's target was not touched");
    }
}
