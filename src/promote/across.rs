//! Locks that hold across fronts sharing a reviews directory (`registry.shared_dir`): the
//! process-wide locks of `decisions` and `promote` serialise one process only, and two
//! fronts may decide on, or promote, the same token at once.
//!
//! A lock is `flock(2)` on a file of the token's under `<reviews dir>/.locks/<task>/`
//! (never next to the review files, which readers list): released when its holder drops it
//! or dies, so a killed front holds nothing. Taken only once [`share`] was called (a front
//! with a shared directory); one gateway keeps its reviews directory as it was.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{Flock, FlockArg};

static SHARED: AtomicBool = AtomicBool::new(false);

/// From now on, decisions and promotions of this process lock across processes too.
pub fn share() {
    SHARED.store(true, Ordering::Release);
}

/// Which of a token's locks.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Read-modify-write of its decision record (held for a file write).
    Record,
    /// A promotion under way (held for the whole promotion).
    Promotion,
}

/// A held lock (none when this process does not share its reviews directory).
pub struct Held(#[allow(dead_code)] Option<Flock<std::fs::File>>);

fn lock_path(dir: &Path, task: &str, token: &str, kind: Kind) -> PathBuf {
    let ext = match kind {
        Kind::Record => "record",
        Kind::Promotion => "promotion",
    };
    dir.join(".locks").join(task).join(format!("{token}.{ext}"))
}

fn open(dir: &Path, task: &str, token: &str, kind: Kind) -> std::io::Result<std::fs::File> {
    crate::datadir::private_dirs(&dir.join(".locks"), Path::new(task))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(lock_path(dir, task, token, kind))
}

/// Waits for the lock (blocking: call it off the async threads for a long-held kind).
pub fn lock(dir: &Path, task: &str, token: &str, kind: Kind) -> std::io::Result<Held> {
    if !SHARED.load(Ordering::Acquire) {
        return Ok(Held(None));
    }
    let f = open(dir, task, token, kind)?;
    Flock::lock(f, FlockArg::LockExclusive)
        .map(|l| Held(Some(l)))
        .map_err(|(_, e)| std::io::Error::from(e))
}

/// The lock if it is free now; None while another holds it.
pub fn try_lock(dir: &Path, task: &str, token: &str, kind: Kind) -> std::io::Result<Option<Held>> {
    if !SHARED.load(Ordering::Acquire) {
        return Ok(Some(Held(None)));
    }
    let f = open(dir, task, token, kind)?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(Held(Some(l)))),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_to_another_holder_until_dropped() {
        share();
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path(), "task", "tok", Kind::Promotion).unwrap();
        // A second open file description, as another front's would be.
        assert!(try_lock(dir.path(), "task", "tok", Kind::Promotion)
            .unwrap()
            .is_none());
        // Another kind and another token are other locks.
        assert!(try_lock(dir.path(), "task", "tok", Kind::Record)
            .unwrap()
            .is_some());
        assert!(try_lock(dir.path(), "task", "other", Kind::Promotion)
            .unwrap()
            .is_some());
        drop(held);
        assert!(try_lock(dir.path(), "task", "tok", Kind::Promotion)
            .unwrap()
            .is_some());
        // Kept out of the task's review files, which readers list.
        assert!(!dir.path().join("task").exists());
    }
}
