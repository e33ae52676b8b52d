//! The tag file a local backend's directory carries (`instance` data dirs, `microvm` VM
//! dirs): which token it serves, so the janitor can find and judge backends after a crash.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{BackendTag, ProviderError};

/// File name of the tag inside a backend's directory.
pub const TAG_FILE: &str = "sandpit-tag.json";

/// The tag in `dir`, if there is a readable one.
pub fn read(dir: &Path) -> Option<BackendTag> {
    std::fs::read(dir.join(TAG_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// Write `tag` into `dir`: whole, owner-only, synced, then renamed over the old one, so a
/// janitor never reads a half-written tag.
pub fn write(dir: &Path, tag: &BackendTag) -> Result<(), ProviderError> {
    write_with(dir, tag, true)
}

/// [`write`] without the sync, for a tag that is only a hint because a synced record
/// elsewhere names the owner (a claimed pool member: the registry's claim). A host crash
/// may leave the old tag or none; a process crash leaves the old one or the new one.
pub fn write_hint(dir: &Path, tag: &BackendTag) -> Result<(), ProviderError> {
    write_with(dir, tag, false)
}

fn write_with(dir: &Path, tag: &BackendTag, sync: bool) -> Result<(), ProviderError> {
    let bytes = serde_json::to_vec_pretty(tag).map_err(|source| ProviderError::Json {
        what: "tag".into(),
        source,
    })?;
    let tmp = dir.join(format!("{TAG_FILE}.tmp"));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        if sync {
            f.sync_all()?;
        }
    }
    std::fs::rename(&tmp, dir.join(TAG_FILE))?;
    Ok(())
}
