//! What a worker keeps of its ready sandboxes on disk, one file each under
//! `<data dir>/worker/sandboxes/` (directory 0700, files 0600), so that a worker restarted
//! after a crash adopts the forks whose TTL has not passed instead of destroying them. No
//! secret is kept: the connection (with the door's password) is left out, and a door gets a
//! new password when its sandbox is adopted (docs/workers.md).

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::provider::remote_api::{self as api, Sandbox};

/// Largest record read back (a sandbox's metadata is small; anything bigger is not ours).
const MAX_RECORD: u64 = 256 * 1024;

/// One kept sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Kept {
    /// The sandbox as reported, without its connection.
    pub sb: Sandbox,
    /// The provider's handle of its fork.
    pub handle: String,
    /// Its door's port in the run that made it: no door of a later run takes it, so a
    /// front's stale connection never reaches another sandbox's door.
    pub port: Option<u16>,
}

/// A record that could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub(super) enum KeepError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding the record of sandbox {id}: {source}")]
    Encode {
        id: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The records' directory.
pub(super) struct Keeper {
    dir: PathBuf,
}

impl Keeper {
    /// `<data_dir>/worker/sandboxes`, both made 0700 if needed (the data dir itself keeps
    /// its mode: the Postgres user must traverse it).
    pub fn open(data_dir: &Path) -> std::io::Result<Keeper> {
        let dir = crate::datadir::private_dirs(&data_dir.join("worker"), Path::new("sandboxes"))?;
        Ok(Keeper { dir })
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        api::valid_id(id).then(|| self.dir.join(format!("{id}.json")))
    }

    /// Writes (or rewrites) a sandbox's record: a 0600 temporary file, synced, renamed.
    pub fn save(&self, sb: &Sandbox, handle: &str) -> Result<(), KeepError> {
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| KeepError::Io { what, path, source }
        };
        let Some(path) = self.path(&sb.id) else {
            return Ok(());
        };
        let mut bare = sb.clone();
        let port = bare.connection.take().map(|c| c.port);
        let rec = Kept {
            sb: bare,
            handle: handle.to_string(),
            port,
        };
        let bytes = serde_json::to_vec(&rec).map_err(|source| KeepError::Encode {
            id: sb.id.clone(),
            source,
        })?;
        let tmp = path.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("creating", &tmp))?;
        f.write_all(&bytes).map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("syncing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))
    }

    /// Removes a sandbox's record (none is fine).
    pub fn forget(&self, id: &str) -> Result<(), KeepError> {
        let Some(path) = self.path(id) else {
            return Ok(());
        };
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(KeepError::Io {
                what: "removing",
                path,
                source,
            }),
        }
    }

    /// Every record that reads back whole; a file that does not (cut by a crash, not ours)
    /// is logged and removed.
    pub fn load_all(&self) -> Vec<Kept> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "worker: reading kept sandboxes failed");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            match read_one(&path) {
                Some(k) if self.path(&k.sb.id).as_deref() == Some(path.as_path()) => out.push(k),
                _ => {
                    tracing::warn!(file = %path.display(), "worker: an unreadable sandbox record removed");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        out.sort_by(|a, b| a.sb.id.cmp(&b.sb.id));
        out
    }
}

/// A record, read up to `MAX_RECORD` bytes; None if it is not one.
fn read_one(path: &Path) -> Option<Kept> {
    if path.extension().is_none_or(|x| x != "json") {
        return None;
    }
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_RECORD + 1).read_to_end(&mut buf).ok()?;
    if buf.len() as u64 > MAX_RECORD {
        return None;
    }
    serde_json::from_slice(&buf).ok()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::Keeper;
    use crate::provider::remote_api::{Connection, Sandbox, SandboxState};

    #[test]
    fn records_keep_no_password_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        let k = Keeper::open(dir.path()).expect("open");
        assert_eq!(mode(dir.path()), 0o711, "the data dir keeps its mode");
        assert_eq!(mode(&dir.path().join("worker/sandboxes")), 0o700);
        let sb = Sandbox {
            id: "sbx-1".into(),
            golden: "g".into(),
            state: SandboxState::Ready,
            metadata: [("sandpit.token".to_string(), "sp_x".to_string())].into(),
            expires_at: Some("2030-01-01T00:00:00Z".into()),
            connection: Some(Connection {
                host: "h".into(),
                port: 4242,
                user: "u".into(),
                password: Some("the-door-password".into()),
                database: "d".into(),
                sslmode: None,
            }),
            error: None,
            version: None,
        };
        k.save(&sb, "inst-1").expect("save");
        let file = dir.path().join("worker/sandboxes/sbx-1.json");
        let text = std::fs::read_to_string(&file).expect("read");
        assert!(!text.contains("the-door-password"), "{text}");
        assert_eq!(mode(&file), 0o600);
        std::fs::write(dir.path().join("worker/sandboxes/cut.json"), b"{\"sb\":").expect("w");
        let all = k.load_all();
        assert_eq!(all.len(), 1);
        assert_eq!(
            (
                all[0].handle.as_str(),
                all[0].port,
                all[0].sb.connection.is_none()
            ),
            ("inst-1", Some(4242), true)
        );
        assert!(!dir.path().join("worker/sandboxes/cut.json").exists());
        k.forget("sbx-1").expect("forget");
        k.forget("sbx-1").expect("forget twice");
        assert!(k.load_all().is_empty());
    }
}
