//! The OS user PostgreSQL runs as. PostgreSQL refuses to run as root, so a root gateway runs
//! its servers as an unprivileged system user; a non-root gateway runs them as itself.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::unistd::{Gid, Uid, User};

use crate::pg::PgError;

/// Default OS user for Postgres when the gateway runs as root.
pub const DEFAULT_RUN_AS: &str = "sandpit";

/// Who Postgres processes run as.
#[derive(Debug, Clone)]
pub struct RunAs {
    /// User name (for logs and pg_ident).
    pub name: String,
    /// Numeric user id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// True when the gateway is root and children must drop to `uid`/`gid` (and files be chowned).
    pub switch: bool,
}

impl RunAs {
    /// Chowns `path` (not following symlinks) to this user when we are switching users.
    pub fn chown(&self, path: &Path) -> Result<(), PgError> {
        if self.switch {
            std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid)).map_err(|e| {
                PgError::Other(format!("chown {} to {}: {e}", path.display(), self.name))
            })?;
        }
        Ok(())
    }
}

/// Resolves the OS user: when euid is 0, `run_as` (default `sandpit`), created as a system user
/// if missing; otherwise the current user.
pub fn resolve(run_as: Option<&str>) -> Result<RunAs, PgError> {
    let euid = Uid::effective();
    if !euid.is_root() {
        let u = User::from_uid(euid).ok().flatten();
        let name = u.map(|u| u.name).unwrap_or_else(|| euid.to_string());
        return Ok(RunAs {
            name,
            uid: euid.as_raw(),
            gid: Gid::effective().as_raw(),
            switch: false,
        });
    }
    let name = run_as.unwrap_or(DEFAULT_RUN_AS);
    if name.is_empty() || name == "root" {
        return Err(PgError::Other(format!(
            "postgres.run_as must name an unprivileged user, not {name:?}: PostgreSQL refuses to run as root"
        )));
    }
    let user = match lookup(name)? {
        Some(u) => u,
        None => {
            // Gateways starting together must not run useradd at the same time: a concurrent
            // useradd rewrites /etc/passwd while another process's initdb looks its uid up.
            let _lock = UseraddLock::acquire()?;
            match lookup(name)? {
                Some(u) => u,
                None => {
                    create_system_user(name)?;
                    lookup(name)?.ok_or_else(|| {
                        PgError::Other(format!("user {name} still missing after useradd"))
                    })?
                }
            }
        }
    };
    if user.uid.is_root() {
        return Err(PgError::Other(format!(
            "postgres.run_as user {name} has uid 0"
        )));
    }
    Ok(RunAs {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        switch: true,
    })
}

/// An exclusive lock held (by flock) across looking up and creating the system user.
struct UseraddLock {
    // Held only to keep the flock until drop.
    _file: std::fs::File,
}

impl UseraddLock {
    const PATH: &'static str = "/run/lock/sandpit-useradd.lock";
    const FALLBACK: &'static str = "/tmp/sandpit-useradd.lock";

    fn acquire() -> Result<UseraddLock, PgError> {
        let open = |p: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(p)
        };
        let file = open(Self::PATH)
            .or_else(|_| open(Self::FALLBACK))
            .map_err(|e| PgError::Other(format!("opening the useradd lock: {e}")))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file descriptor we own; released when the file is closed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(PgError::Other(format!(
                "locking the useradd lock: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(UseraddLock { _file: file })
    }
}

fn lookup(name: &str) -> Result<Option<User>, PgError> {
    User::from_name(name).map_err(|e| PgError::Other(format!("looking up user {name}: {e}")))
}

fn create_system_user(name: &str) -> Result<(), PgError> {
    tracing::info!(user = name, "creating system user for PostgreSQL");
    let out = std::process::Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ])
        .output()
        .map_err(|e| PgError::Other(format!("running useradd for {name}: {e}")))?;
    // Exit code 9 means "already exists" (another process won the race): fine.
    if !out.status.success() && out.status.code() != Some(9) {
        return Err(PgError::Other(format!(
            "useradd {name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Name of the user the gateway itself runs as (the peer identity Postgres sees on the socket).
pub fn gateway_user_name() -> Result<String, PgError> {
    let euid = Uid::effective();
    User::from_uid(euid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .ok_or_else(|| PgError::Other(format!("uid {euid} has no user name (peer auth needs one)")))
}

/// Whether `user` can search (traverse) every directory from `/` down to and including `dir`.
/// Supplementary groups are ignored on purpose: children drop them (setgroups([])).
pub fn can_traverse(dir: &Path, user: &RunAs) -> bool {
    if !user.switch || user.uid == 0 {
        return true;
    }
    dir.ancestors().all(|d| match std::fs::metadata(d) {
        Ok(m) => {
            let mode = m.mode();
            if m.uid() == user.uid {
                mode & 0o100 != 0
            } else if m.gid() == user.gid {
                mode & 0o010 != 0
            } else {
                mode & 0o001 != 0
            }
        }
        Err(_) => false,
    })
}
