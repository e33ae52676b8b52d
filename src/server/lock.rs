//! One gateway per data dir: `serve` holds an exclusive `flock` on `<data dir>/gateway.lock`
//! for the life of the process. Two gateways on one data dir would reap each other's
//! backends and stop each other's review reference, so the second one refuses to start
//! before it touches anything. The kernel drops the lock when the process ends, however it
//! ends (SIGKILL included), so a stale lock file never blocks a restart.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::fcntl::{Flock, FlockArg};

/// Name of the lock file in the data dir.
pub const LOCK_FILE: &str = "gateway.lock";

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error("another sandpit gateway{} is already serving data dir {dir}; one gateway per data dir (stop it, or give this one its own --data-dir)", holder_text(*.holder))]
    Held {
        /// The data dir.
        dir: PathBuf,
        /// Pid the holder wrote into the lock file, when readable.
        holder: Option<u32>,
    },
    /// The lock file could not be opened or locked.
    #[error("lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

fn holder_text(pid: Option<u32>) -> String {
    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
}

/// The held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct DataDirLock {
    _lock: Flock<File>,
}

/// Data dir locks this process holds now.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Whether this process holds a data dir's lock, i.e. is serving it: only then are the
/// servers under it this process's to stop.
pub fn held() -> bool {
    HELD.load(Ordering::Acquire) > 0
}

impl Drop for DataDirLock {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes the lock of `data_dir` (which must exist) without waiting, and writes this
/// process's pid into the lock file so that a refused gateway can name the holder.
pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock, LockError> {
    let path = data_dir.join(LOCK_FILE);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let holder = file
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            return Err(LockError::Held {
                dir: data_dir.to_path_buf(),
                holder,
            });
        }
        Err((_, e)) => return Err(io(std::io::Error::from(e))),
    };
    // Only the holder writes: the pid is for the message of the next one refused.
    lock.set_len(0).map_err(io)?;
    lock.seek(SeekFrom::Start(0)).map_err(io)?;
    writeln!(lock, "{}", std::process::id()).map_err(io)?;
    HELD.fetch_add(1, Ordering::AcqRel);
    Ok(DataDirLock { _lock: lock })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_naming_dir_and_pid_and_released_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let first = lock_data_dir(tmp.path()).unwrap();
        // flock locks belong to the open file description: a second open in this very
        // process conflicts just like another process would.
        let e = lock_data_dir(tmp.path()).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, LockError::Held { holder: Some(p), .. } if p == std::process::id()),
            "{msg}"
        );
        assert!(msg.contains(&tmp.path().display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(first);
        let _again = lock_data_dir(tmp.path()).unwrap();
    }
}
