//! Copying the golden data directory into a new instance: a reflink (`FICLONE`) per file where
//! the filesystem supports it (XFS, btrfs: near constant time, shared blocks), else a plain copy.
//!
//! The copy runs as root, between directories the servers' OS user may write to (the golden
//! is that user's, the fork becomes that user's), so it never follows a link: every entry is
//! opened relative to its parent's descriptor with `O_NOFOLLOW` (a symlink is copied as a
//! symlink), destination files are created `O_EXCL` (nothing planted is overwritten), and a
//! directory is handed to the OS user only once everything in it is copied and handed over,
//! the top directory last, so that user can touch nothing until the copy is complete.

use std::ffi::{CStr, CString};
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
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

/// Recursively copies `src` to `dst` (which must not exist: not even as a symlink),
/// preserving modes, and hands everything to `owner` once copied; a copy that fails midway
/// is removed. When we switch users, the
/// top of `src` (a golden) is first made root-owned, so `owner` cannot change it (see
/// [`seal`]). Blocking; run it on a blocking thread.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    method: CopyMethod,
    owner: &RunAs,
) -> Result<(), ProviderError> {
    let fail = |what: &str, p: &Path, source: io::Error| ProviderError::ForkIo {
        what: format!("{what} {}", p.display()),
        source,
    };
    let src_dir = open_path(src, DIR_FLAGS).map_err(|e| fail("opening", src, e))?;
    let src_stat = fstat(&src_dir).map_err(|e| fail("reading", src, e))?;
    if owner.switch {
        seal(&src_dir, &src_stat).map_err(|e| fail("sealing", src, e))?;
    }
    let mode = src_stat.st_mode & 0o7777;
    // Root-only until the copy is done; mkdir does not follow a link in the final component.
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dst)
        .map_err(|e| fail("creating", dst, e))?;
    let copied = (|| {
        let dst_dir = open_path(dst, DIR_FLAGS).map_err(|e| fail("opening", dst, e))?;
        let mut at = src.to_path_buf();
        copy_dir(&src_dir, &dst_dir, &mut at, method, owner)?;
        // mkdir honours the umask; set the exact mode (Postgres insists on 0700/0750 for the
        // data dir).
        finish(&dst_dir, mode, owner).map_err(|e| fail("handing over", dst, e))
    })();
    if copied.is_err() {
        // A copy cut short (a full disk) is removed: it is of no use and holds space. We made
        // `dst`, and std's remove_dir_all never follows links.
        if let Err(e) = fs::remove_dir_all(dst) {
            tracing::warn!(path = %dst.display(), error = %e, "removing a partial copy failed");
        }
    }
    copied
}

/// Makes the source (a golden's data dir, built by the servers' OS user and never started
/// again) ours: a root-owned 0700/0750 directory that user can no longer enter, so nothing
/// it runs can change what every later fork starts from.
fn seal(src: &OwnedFd, st: &libc::stat) -> io::Result<()> {
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    if st.st_uid == uid && st.st_gid == gid {
        return Ok(());
    }
    // SAFETY: a plain syscall on a descriptor we own.
    check(unsafe { libc::fchown(src.as_raw_fd(), uid, gid) })
}

/// Flags of a directory opened to walk it.
const DIR_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
/// Flags of a source file: a fifo swapped in must not block the open.
const SRC_FILE_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
/// Flags of a destination file: never an existing file, never through a link.
const DST_FILE_FLAGS: libc::c_int =
    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// Copies the entries of `src` into `dst` (both open directories); `at` names `src` in errors.
fn copy_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    at: &mut std::path::PathBuf,
    method: CopyMethod,
    owner: &RunAs,
) -> Result<(), ProviderError> {
    let fail = |what: &str, p: &Path, source: io::Error| ProviderError::ForkIo {
        what: format!("{what} {}", p.display()),
        source,
    };
    for name in list_dir(src).map_err(|e| fail("reading", at, e))? {
        at.push(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let st = fstatat_nofollow(src, &name).map_err(|e| fail("reading", at, e))?;
        let mode = st.st_mode & 0o7777;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                let s = openat(src, &name, DIR_FLAGS, 0).map_err(|e| fail("opening", at, e))?;
                mkdirat(dst, &name).map_err(|e| fail("creating the copy of", at, e))?;
                let d = openat(dst, &name, DIR_FLAGS, 0)
                    .map_err(|e| fail("opening the copy of", at, e))?;
                copy_dir(&s, &d, at, method, owner)?;
                finish(&d, mode, owner).map_err(|e| fail("handing over", at, e))?;
            }
            libc::S_IFREG => {
                let s =
                    openat(src, &name, SRC_FILE_FLAGS, 0).map_err(|e| fail("opening", at, e))?;
                if fstat(&s).map_err(|e| fail("reading", at, e))?.st_mode & libc::S_IFMT
                    != libc::S_IFREG
                {
                    return Err(fail(
                        "copying",
                        at,
                        io::Error::other("changed during the copy"),
                    ));
                }
                let d = openat(dst, &name, DST_FILE_FLAGS, 0o600)
                    .map_err(|e| fail("creating the copy of", at, e))?;
                let (s, d) = (File::from(s), File::from(d));
                copy_contents(&s, &d, method).map_err(|e| fail("copying", at, e))?;
                let d = OwnedFd::from(d);
                finish(&d, mode, owner).map_err(|e| fail("handing over", at, e))?;
            }
            libc::S_IFLNK => {
                let target = readlinkat(src, &name).map_err(|e| fail("reading", at, e))?;
                symlinkat(&target, dst, &name).map_err(|e| fail("linking", at, e))?;
                if owner.switch {
                    fchownat_nofollow(dst, &name, owner)
                        .map_err(|e| fail("handing over", at, e))?;
                }
            }
            // Sockets, fifos and devices do not belong in a stopped data dir: skipped.
            _ => {}
        }
        at.pop();
    }
    Ok(())
}

fn copy_contents(s: &File, d: &File, method: CopyMethod) -> io::Result<()> {
    if method == CopyMethod::Reflink {
        match clone_file(s, d) {
            Ok(()) => return Ok(()),
            // A failed clone leaves the destination empty: copy into it instead.
            Err(e) if clone_unsupported(&e) => {}
            Err(e) => return Err(e),
        }
    }
    // std's File-to-File copy uses copy_file_range, so the bytes stay in the kernel.
    io::copy(&mut &*s, &mut &*d).map(|_| ())
}

/// Exact mode (creation honoured the umask), then ownership: the last thing done to an entry.
fn finish(fd: &OwnedFd, mode: libc::mode_t, owner: &RunAs) -> io::Result<()> {
    // SAFETY: plain syscalls on a descriptor we own.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
    if owner.switch {
        check(unsafe { libc::fchown(fd.as_raw_fd(), owner.uid, owner.gid) })?;
    }
    Ok(())
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

fn open_path(p: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cpath(p)?;
    // SAFETY: a NUL-terminated path; the returned descriptor is owned by the OwnedFd.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    check(fd)?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn openat(
    dir: &OwnedFd,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name relative to an open directory; the descriptor is owned.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint) };
    check(fd)?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn mkdirat(dir: &OwnedFd, name: &CStr) -> io::Result<()> {
    // Root-only until it is handed over.
    // SAFETY: a NUL-terminated name relative to an open directory.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o700) })
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat fills the buffer when it returns 0.
    check(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    Ok(unsafe { st.assume_init() })
}

fn fstatat_nofollow(dir: &OwnedFd, name: &CStr) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstatat fills the buffer when it returns 0.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(unsafe { st.assume_init() })
}

fn readlinkat(dir: &OwnedFd, name: &CStr) -> io::Result<CString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the buffer is as long as we say; readlinkat does not NUL-terminate.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n >= buf.len() {
        return Err(io::Error::other("link target too long"));
    }
    buf.truncate(n);
    CString::new(buf).map_err(|_| io::Error::other("link target holds a NUL byte"))
}

fn symlinkat(target: &CStr, dir: &OwnedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: NUL-terminated strings; the link is made relative to an open directory.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
}

fn fchownat_nofollow(dir: &OwnedFd, name: &CStr, owner: &RunAs) -> io::Result<()> {
    // SAFETY: a NUL-terminated name relative to an open directory; the link itself is changed.
    check(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            owner.uid,
            owner.gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// The names in an open directory, without `.` and `..`.
fn list_dir(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    // fdopendir takes the descriptor over, so it gets a duplicate (which shares the offset:
    // rewound before reading).
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor or -1.
    let dup: RawFd = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    check(dup)?;
    // SAFETY: dup is a directory descriptor we own; on success the DIR owns it.
    let dp = unsafe { libc::fdopendir(dup) };
    if dp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so dup is still ours to close.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    let mut names = Vec::new();
    // SAFETY: dp is a valid DIR until closedir below.
    unsafe { libc::rewinddir(dp) };
    let result = loop {
        // readdir signals an error only through errno (thread-local).
        // SAFETY: writing this thread's errno.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dp is a valid DIR.
        let ent = unsafe { libc::readdir(dp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break match e.raw_os_error() {
                Some(0) | None => Ok(()),
                Some(_) => Err(e),
            };
        }
        // SAFETY: d_name is NUL-terminated and valid until the next readdir.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: closes the DIR and its descriptor (the duplicate).
    unsafe { libc::closedir(dp) };
    result.map(|()| names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// The owner forks are handed to: `nobody` when the test runs as root, else ourselves.
    fn owner() -> RunAs {
        let root = nix::unistd::geteuid().is_root();
        RunAs {
            name: "nobody".into(),
            uid: if root {
                65534
            } else {
                nix::unistd::geteuid().as_raw()
            },
            gid: if root {
                65534
            } else {
                nix::unistd::getegid().as_raw()
            },
            switch: root,
        }
    }

    /// A small data-dir-like tree with a file, a subdirectory and a link pointing outside.
    fn source(root: &Path, outside: &Path) -> std::path::PathBuf {
        let src = root.join("src");
        fs::create_dir(&src).unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o750)).unwrap();
        fs::write(src.join("PG_VERSION"), b"15\n").unwrap();
        fs::set_permissions(src.join("PG_VERSION"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::create_dir(src.join("base")).unwrap();
        fs::write(src.join("base/1"), vec![7u8; 70_000]).unwrap();
        std::os::unix::fs::symlink(outside, src.join("pg_wal")).unwrap();
        src
    }

    #[test]
    fn copies_modes_links_and_hands_everything_over() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), b"not for the fork").unwrap();
        let src = source(tmp.path(), &outside);
        let dst = tmp.path().join("dst");
        let who = owner();
        // As a golden is: built by the servers' OS user.
        if who.switch {
            std::os::unix::fs::chown(&src, Some(who.uid), Some(who.gid)).unwrap();
        }
        for method in [CopyMethod::Copy, probe(tmp.path())] {
            let _ = fs::remove_dir_all(&dst);
            copy_tree(&src, &dst, method, &who).unwrap();
            assert_eq!(fs::read(dst.join("PG_VERSION")).unwrap(), b"15\n");
            assert_eq!(fs::read(dst.join("base/1")).unwrap(), vec![7u8; 70_000]);
            // The link is copied as a link, not followed.
            let link = fs::symlink_metadata(dst.join("pg_wal")).unwrap();
            assert!(link.file_type().is_symlink());
            assert_eq!(fs::read_link(dst.join("pg_wal")).unwrap(), outside);
            let mode = |p: &str| fs::symlink_metadata(dst.join(p)).unwrap().mode() & 0o7777;
            assert_eq!(
                (mode(""), mode("PG_VERSION"), mode("base")),
                (0o750, 0o640, 0o755)
            );
            for p in ["", "PG_VERSION", "base", "base/1", "pg_wal"] {
                let m = fs::symlink_metadata(dst.join(p)).unwrap();
                assert_eq!((m.uid(), m.gid()), (who.uid, who.gid), "{p}");
            }
        }
        // The source is root's now: the servers' OS user cannot enter it.
        let m = fs::metadata(&src).unwrap();
        assert_eq!(m.uid(), nix::unistd::geteuid().as_raw());
        // The link's target was neither copied nor handed over.
        let m = fs::metadata(outside.join("secret")).unwrap();
        assert_eq!(m.uid(), nix::unistd::geteuid().as_raw());
    }

    #[test]
    fn a_copy_that_runs_out_of_space_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let src = source(tmp.path(), &outside);
        fs::write(src.join("base/2"), vec![9u8; 400_000]).unwrap();
        let small = tmp.path().join("small");
        fs::create_dir(&small).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
            .arg(&small)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs (needs root)");
            return;
        }
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(self.0).status();
            }
        }
        let _unmount = Unmount(&small);
        let dst = small.join("dst");
        let err = copy_tree(&src, &dst, CopyMethod::Copy, &owner()).unwrap_err();
        assert!(err.to_string().contains("No space"), "{err}");
        assert!(!dst.exists(), "the partial copy is left behind");
        assert_eq!(fs::read_dir(&small).unwrap().count(), 0);
    }

    #[test]
    fn a_link_planted_at_the_destination_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("PG_VERSION"), b"precious").unwrap();
        let src = source(tmp.path(), &outside);
        let who = owner();

        // The destination itself is a link to a directory elsewhere.
        let dst = tmp.path().join("dst-link");
        std::os::unix::fs::symlink(&outside, &dst).unwrap();
        assert!(copy_tree(&src, &dst, CopyMethod::Copy, &who).is_err());

        // Links planted inside a destination directory, named like what the copy writes.
        let dst = tmp.path().join("dst");
        fs::create_dir(&dst).unwrap();
        std::os::unix::fs::symlink(outside.join("PG_VERSION"), dst.join("PG_VERSION")).unwrap();
        std::os::unix::fs::symlink(&outside, dst.join("base")).unwrap();
        let s = open_path(&src, DIR_FLAGS).unwrap();
        let d = open_path(&dst, DIR_FLAGS).unwrap();
        let mut at = src.clone();
        assert!(copy_dir(&s, &d, &mut at, CopyMethod::Copy, &who).is_err());

        // Nothing outside was written, created or handed over.
        assert_eq!(fs::read(outside.join("PG_VERSION")).unwrap(), b"precious");
        assert!(!outside.join("1").exists());
        let mut names: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, vec![std::ffi::OsString::from("PG_VERSION")]);
        for p in [outside.clone(), outside.join("PG_VERSION")] {
            assert_eq!(
                fs::metadata(&p).unwrap().uid(),
                nix::unistd::geteuid().as_raw()
            );
        }
    }
}
