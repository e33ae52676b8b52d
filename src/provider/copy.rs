//! Copying the golden data directory into a new instance: a reflink (`FICLONE`) per file where
//! the filesystem supports it (XFS, btrfs: near constant time, shared blocks), else a plain copy.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::pg::user::RunAs;
use crate::provider::ProviderError;

/// How files are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMethod {
    /// `ioctl(FICLONE)`: copy-on-write clone of each file.
    Reflink,
    /// Byte copy (std's copy uses `copy_file_range`, so it stays in the kernel).
    Copy,
}

impl CopyMethod {
    /// Name as reported in `Backend::method`.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyMethod::Reflink => "reflink",
            CopyMethod::Copy => "copy",
        }
    }
}

/// Decides once, by cloning a small temp file inside `dir`, whether reflinks work there.
pub fn probe(dir: &Path) -> CopyMethod {
    let src = dir.join(format!(".reflink-probe-{}-a", std::process::id()));
    let dst = dir.join(format!(".reflink-probe-{}-b", std::process::id()));
    let result = (|| -> io::Result<()> {
        fs::write(&src, b"sandpit reflink probe")?;
        let s = File::open(&src)?;
        let d = File::create(&dst)?;
        clone_file(&s, &d)
    })();
    let _ = fs::remove_file(&src);
    let _ = fs::remove_file(&dst);
    match result {
        Ok(()) => CopyMethod::Reflink,
        Err(e) => {
            tracing::debug!(error = %e, "reflink probe failed; using plain copies");
            CopyMethod::Copy
        }
    }
}

fn clone_file(src: &File, dst: &File) -> io::Result<()> {
    // SAFETY: FICLONE takes the source fd as its argument; both fds are open for the call.
    let rc = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) };
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether a failed clone means "this filesystem/pair cannot reflink" (then copy instead).
fn clone_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EXDEV) | Some(libc::EINVAL) | Some(libc::ENOTTY)
    )
}

/// Recursively copies `src` to `dst` (which must not exist), preserving modes and chowning
/// everything to `owner`. Blocking; run it on a blocking thread.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    method: CopyMethod,
    owner: &RunAs,
) -> Result<(), ProviderError> {
    let meta = fs::symlink_metadata(src)?;
    let ctx = |what: &str, p: &Path, e: io::Error| {
        ProviderError::Fork(format!("{what} {}: {e}", p.display()))
    };
    fs::DirBuilder::new()
        .mode(meta.mode() & 0o7777)
        .create(dst)
        .map_err(|e| ctx("creating", dst, e))?;
    // mkdir honours the umask; set the exact mode (Postgres insists on 0700/0750 for the data dir).
    fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    owner.chown(dst)?;
    for entry in fs::read_dir(src).map_err(|e| ctx("reading", src, e))? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let ft = entry.file_type()?;
        if ft.is_dir() {
            copy_tree(&from, &to, method, owner)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&from)?;
            std::os::unix::fs::symlink(&target, &to).map_err(|e| ctx("linking", &to, e))?;
            owner.chown(&to)?;
        } else if ft.is_file() {
            copy_file(&from, &to, method).map_err(|e| ctx("copying", &from, e))?;
            owner.chown(&to)?;
        }
        // Sockets, fifos and devices do not belong in a stopped data dir: skipped.
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path, method: CopyMethod) -> io::Result<()> {
    if method == CopyMethod::Reflink {
        let s = File::open(from)?;
        let mode = s.metadata()?.mode() & 0o7777;
        let d = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(to)?;
        match clone_file(&s, &d) {
            Ok(()) => {
                d.set_permissions(fs::Permissions::from_mode(mode))?;
                return Ok(());
            }
            Err(e) if clone_unsupported(&e) => {
                drop(d);
                fs::remove_file(to)?;
            }
            Err(e) => return Err(e),
        }
    }
    // std::fs::copy preserves the permission bits.
    fs::copy(from, to).map(|_| ())
}
