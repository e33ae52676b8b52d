//! The socket directory of a server (a golden's build server, a fork): where it is, made
//! ours only, removed.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::pg::process;
use crate::pg::user::RunAs;
use crate::provider::ProviderError;

/// Socket directory for a server whose files live in `dir`: `<dir>/s` if the socket path fits
/// comfortably in `sun_path`, else a short per-dir path under /tmp.
pub fn socket_dir_for(dir: &Path) -> PathBuf {
    let local = dir.join("s");
    if process::socket_path(&local).as_os_str().len() < 100 {
        return local;
    }
    let h = hex::encode(Sha256::digest(dir.as_os_str().as_encoded_bytes()));
    PathBuf::from(format!("/tmp/sandpit-s-{}", &h[..16]))
}

/// Creates the socket directory (mode 0700, owned by the Postgres user: only it and root can
/// connect). Refuses a symlink or non-directory planted at that path.
pub fn prepare_socket_dir(dir: &Path, run_as: &RunAs) -> Result<(), ProviderError> {
    match fs::symlink_metadata(dir) {
        // Under /tmp someone else could have created it first: only accept our own.
        Ok(m)
            if m.file_type().is_dir()
                && (m.uid() == run_as.uid || m.uid() == nix::unistd::geteuid().as_raw()) => {}
        Ok(_) => {
            return Err(ProviderError::Other(format!(
                "socket dir {} exists and is not our directory",
                dir.display()
            )))
        }
        Err(_) => fs::DirBuilder::new().mode(0o700).create(dir)?,
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    run_as.chown(dir)?;
    Ok(())
}

/// Removes a socket dir if it lives outside `owner_dir` (inside, it goes with the owner dir).
pub fn remove_socket_dir(sock: &Path, owner_dir: &Path) -> Result<(), ProviderError> {
    if sock.starts_with(owner_dir) {
        if sock.exists() {
            fs::remove_dir_all(sock)?;
        }
        return Ok(());
    }
    match fs::remove_dir_all(sock) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}
