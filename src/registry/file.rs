//! The embedded token store: one JSON file per token in the data dir, written atomically and
//! fsynced, so a write that returned survives a crash. One gateway process owns it.
//!
//! A full disk must not stop a token from ending (revoke, expiry). So each token that may
//! still change keeps a reserve file beside its own (`<id>.json.reserve`), as large as the
//! token file, its blocks written when there was room. When writing a new token file fails
//! for want of space, the record is written over the reserve's own blocks instead and the two
//! files are swapped (`renameat2(RENAME_EXCHANGE)`): no new block is needed, the swap is
//! atomic, and the old file becomes the next reserve. Token files are padded with spaces
//! (valid trailing JSON whitespace) to a whole number of 4 KiB blocks, twice the record's
//! size, so a record that grows a little still fits in its reserve. This holds on
//! filesystems that overwrite in place (ext4, XFS, tmpfs); a copy-on-write filesystem
//! (btrfs, ZFS) needs new blocks for any write.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dashmap::DashMap;

use super::claims::{self, ClaimJournal, ClaimLine};
use super::{RegistryError, TokenRecord};

/// Journal size above which its lines are written into their token files and it is emptied.
const JOURNAL_COMPACT_BYTES: u64 = 256 * 1024;

/// Token files under one directory.
pub struct FileStore {
    dir: PathBuf,
    // Serialises file writes so an older state can never overwrite a newer one.
    write_lock: Mutex<()>,
    /// First connections' claims, one line each (see `claims`).
    journal: std::sync::Arc<ClaimJournal>,
}

impl FileStore {
    /// Open (or create) the directory and load every token file into `into`.
    pub fn open(
        dir: &Path,
        into: &DashMap<String, TokenRecord>,
    ) -> Result<FileStore, RegistryError> {
        let io = |source| RegistryError::Io {
            path: dir.to_path_buf(),
            source,
        };
        crate::datadir::private_dirs(dir, std::path::Path::new("")).map_err(io)?;
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue; // temp files from an interrupted write
            }
            let text = std::fs::read(&path).map_err(|source| RegistryError::Io {
                path: path.clone(),
                source,
            })?;
            let rec: TokenRecord =
                serde_json::from_slice(&text).map_err(|e| RegistryError::Corrupt {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            into.insert(rec.id.clone(), rec);
        }
        let (journal, lines) = ClaimJournal::open(dir).map_err(io)?;
        let store = FileStore {
            dir: dir.to_path_buf(),
            write_lock: Mutex::new(()),
            journal: std::sync::Arc::new(journal),
        };
        // Claims journaled before a crash or stop: into their token files, then emptied.
        for line in &lines {
            let Some(mut rec) = into.get(&line.token).map(|r| r.clone()) else {
                continue;
            };
            if line.apply(&mut rec) {
                tracing::info!(token = %rec.id, backend = %line.backend, "claim replayed from the journal");
                into.insert(rec.id.clone(), rec);
            }
        }
        if store.journal.bytes() > 0 {
            store.compact(into)?;
        }
        // Tokens written before reserves existed, or whose reserve a full disk used up.
        for rec in into.iter() {
            let len = std::fs::metadata(store.dir.join(format!("{}.json", rec.id)))
                .map(|m| m.len() as usize)
                .unwrap_or(0);
            store.keep_reserve(&rec, len.max(slot_len(0)));
        }
        Ok(store)
    }

    /// Store a new token (on disk before this returns); the cache is the source of truth.
    pub fn insert(
        &self,
        cache: &DashMap<String, TokenRecord>,
        rec: TokenRecord,
    ) -> Result<(), RegistryError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        if cache.contains_key(&rec.id) {
            return Err(RegistryError::Exists(rec.id));
        }
        self.persist(&rec)?;
        cache.insert(rec.id.clone(), rec);
        Ok(())
    }

    /// Change a token and persist it; returns the new record (None if unknown). With
    /// `sync_rename` false the directory is not synced after the rename: after a host crash
    /// the file holds the old record or the new one (each written whole and synced before
    /// its rename), so only a change the caller can afford to lose may skip it.
    pub fn update(
        &self,
        cache: &DashMap<String, TokenRecord>,
        id: &str,
        sync_rename: bool,
        f: impl FnOnce(&mut TokenRecord),
    ) -> Result<Option<TokenRecord>, RegistryError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut rec) = cache.get(id).map(|r| r.clone()) else {
            return Ok(None);
        };
        f(&mut rec);
        self.persist_with(&rec, sync_rename)?;
        cache.insert(id.to_string(), rec.clone());
        Ok(Some(rec))
    }

    /// Record that token `id` got `backend` (its first connection's claim) with one journal
    /// line and no sync; returns the new record and the line's sequence number for
    /// [`FileStore::commit_claims`]. Should the append fail (a full disk), the record is
    /// written whole and synced instead (sequence 0: nothing to commit).
    pub fn claim(
        &self,
        cache: &DashMap<String, TokenRecord>,
        id: &str,
        backend: &str,
        golden: Option<String>,
    ) -> Result<Option<(TokenRecord, u64)>, RegistryError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut rec) = cache.get(id).map(|r| r.clone()) else {
            return Ok(None);
        };
        let line = ClaimLine {
            token: id.to_string(),
            backend: backend.to_string(),
            golden: golden.clone(),
            fork_count: rec.fork_count,
        };
        // A record that already names a backend (one that vanished) is not what a replayed
        // line may change: write it whole.
        let journaled = if rec.backend.is_none() && rec.state.is_usable() {
            match self.journal.append(&line) {
                Ok(seq) => Some(seq),
                Err(e) => {
                    tracing::warn!(token = %id, error = %e, "claim journal append failed; writing the token file");
                    None
                }
            }
        } else {
            None
        };
        claims::claim(&mut rec, backend, golden);
        let seq = match journaled {
            Some(seq) => seq,
            None => {
                self.persist(&rec)?;
                0
            }
        };
        cache.insert(id.to_string(), rec.clone());
        Ok(Some((rec, seq)))
    }

    /// Make the claims up to `seq` durable (one sync for all claims appended meanwhile);
    /// when the journal has grown large, its lines go into their token files first.
    pub async fn commit_claims(
        &self,
        cache: &DashMap<String, TokenRecord>,
        seq: u64,
    ) -> Result<(), RegistryError> {
        if seq == 0 {
            return Ok(());
        }
        let j = self.journal.clone();
        let path = j.path().to_path_buf();
        let io = |source| RegistryError::Io {
            path: path.clone(),
            source,
        };
        tokio::task::spawn_blocking(move || j.sync_upto(seq))
            .await
            .map_err(|e| io(std::io::Error::other(e)))?
            .map_err(io)?;
        if self.journal.bytes() > JOURNAL_COMPACT_BYTES {
            let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.compact(cache)?;
        }
        Ok(())
    }

    /// Write every token file whole (synced), then empty the journal. Callers hold the
    /// write lock or are the only user (open), so no claim is appended meanwhile.
    fn compact(&self, cache: &DashMap<String, TokenRecord>) -> Result<(), RegistryError> {
        let path = self.journal.path().to_path_buf();
        let bytes = std::fs::read(&path).map_err(|source| RegistryError::Io {
            path: path.clone(),
            source,
        })?;
        let named: std::collections::BTreeSet<String> = bytes
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice::<ClaimLine>(l).ok())
            .map(|l| l.token)
            .collect();
        for id in named {
            if let Some(rec) = cache.get(&id).map(|r| r.clone()) {
                self.persist(&rec)?;
            }
        }
        self.journal
            .clear()
            .map_err(|source| RegistryError::Io { path, source })
    }

    fn persist(&self, rec: &TokenRecord) -> Result<(), RegistryError> {
        self.persist_with(rec, true)
    }

    fn persist_with(&self, rec: &TokenRecord, sync_rename: bool) -> Result<(), RegistryError> {
        let path = self.dir.join(format!("{}.json", rec.id));
        let io = |source| RegistryError::Io {
            path: path.clone(),
            source,
        };
        let mut bytes = serde_json::to_vec_pretty(rec).map_err(|e| RegistryError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        bytes.resize(slot_len(bytes.len()), b' ');
        match self.replace(rec, &path, &bytes, sync_rename) {
            Ok(()) => {
                self.keep_reserve(rec, bytes.len());
                Ok(())
            }
            Err(e) if no_space(&e) => {
                let _ = std::fs::remove_file(tmp_path(&self.dir, &rec.id));
                match self.write_over_reserve(rec, &path, &bytes) {
                    Ok(()) => {
                        metrics::counter!("sandpit_registry_reserve_writes_total").increment(1);
                        tracing::warn!(token = %rec.id, "disk full: token change written into its reserved space");
                        Ok(())
                    }
                    Err(e2) => {
                        tracing::error!(token = %rec.id, error = %e2, "disk full and the token's reserve could not be used");
                        Err(io(e))
                    }
                }
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Write a new file beside the old one and rename it over (needs free space).
    fn replace(
        &self,
        rec: &TokenRecord,
        path: &Path,
        bytes: &[u8],
        sync_rename: bool,
    ) -> std::io::Result<()> {
        let tmp = tmp_path(&self.dir, &rec.id);
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode_0600()
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        // The rename is durable only once the directory is synced.
        if sync_rename {
            self.sync_dir()?;
        }
        Ok(())
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all())
    }

    /// The record written over the reserve's blocks, then the reserve swapped in: no new
    /// space needed as long as the record fits in what the reserve holds.
    fn write_over_reserve(
        &self,
        rec: &TokenRecord,
        path: &Path,
        bytes: &[u8],
    ) -> std::io::Result<()> {
        let reserve = reserve_path(&self.dir, &rec.id);
        // No create: an existing reserve only (O_NOFOLLOW: the dir is ours alone anyway).
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags_nofollow()
            .open(&reserve)?;
        let have = f.metadata()?.len() as usize;
        let mut buf = bytes.to_vec();
        // Spaces up to the reserve's length: its tail must not hold part of an old record.
        if buf.len() < have {
            buf.resize(have, b' ');
        }
        f.write_all_at(&buf, 0)?;
        f.sync_all()?;
        drop(f);
        match exchange(&reserve, path) {
            Ok(()) => {}
            // A filesystem without the swap: the old file goes, and with it the reserve.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => std::fs::rename(&reserve, path)?,
            Err(e) => return Err(e),
        }
        self.sync_dir()
    }

    /// Keep the reserve of a token that may still change at least `len` bytes long (its
    /// blocks written); remove it once the token has ended and its backend is gone.
    /// Best effort: without room, the reserve stays as it is.
    fn keep_reserve(&self, rec: &TokenRecord, len: usize) {
        let reserve = reserve_path(&self.dir, &rec.id);
        if !rec.state.is_usable() && rec.backend.is_none() {
            let _ = std::fs::remove_file(&reserve);
            return;
        }
        if std::fs::symlink_metadata(&reserve).is_ok_and(|m| m.is_file() && m.len() >= len as u64) {
            return;
        }
        let made = (|| -> std::io::Result<()> {
            let tmp = reserve.with_extension("reserve.tmp");
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode_0600()
                .open(&tmp)?;
            // Real bytes, not a hole: the blocks must exist before the disk fills.
            f.write_all(&vec![b' '; len])?;
            f.sync_all()?;
            std::fs::rename(&tmp, &reserve)
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_file(reserve.with_extension("reserve.tmp"));
            tracing::debug!(token = %rec.id, error = %e, "cannot write the token's reserve file");
        }
    }
}

/// Bytes a token file (and its reserve) is padded to: whole 4 KiB blocks, twice the record.
fn slot_len(n: usize) -> usize {
    (n.max(1024) * 2).div_ceil(4096) * 4096
}

fn tmp_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json.tmp"))
}

fn reserve_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json.reserve"))
}

/// Whether a write failed for want of space (or quota).
fn no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Swap two names atomically (both must exist).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths, relative to the working directory when relative.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }

    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{CapMode, Caps, TokenState};

    fn record(id: &str) -> TokenRecord {
        let now = time::OffsetDateTime::now_utc();
        TokenRecord {
            id: id.into(),
            task: "t".into(),
            metadata: Default::default(),
            created_at: now,
            expires_at: now,
            caps: Caps {
                max_rows: 1,
                max_bytes: 1,
                max_connections: 1,
                cap_mode: CapMode::Truncate,
                allow: None,
                statement_timeout_ms: 0,
                idle_in_transaction_timeout_ms: 0,
            },
            state: TokenState::Live,
            verifier: crate::auth::Verifier::from_secret("s"),
            backend: Some("b".into()),
            fork_count: 1,
            golden: None,
            superuser: false,
            ended_at: None,
            end: None,
            review_error: None,
            ended_why: None,
        }
    }

    /// A small tmpfs, unmounted on drop (None when mounting is not allowed here).
    struct Tmpfs {
        dir: PathBuf,
        _parent: tempfile::TempDir,
    }

    impl Tmpfs {
        fn mount(size: &str) -> Option<Tmpfs> {
            let t = tempfile::tempdir().ok()?;
            let dir = t.path().join("fs");
            std::fs::create_dir(&dir).ok()?;
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            ok.then_some(Tmpfs { dir, _parent: t })
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.dir).status();
        }
    }

    /// Fill a filesystem to the last byte.
    fn fill(dir: &Path) {
        let mut f = std::fs::File::create(dir.join("fill")).unwrap();
        let chunk = vec![1u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&[1u8]).is_ok() {}
    }

    #[test]
    fn a_token_ends_on_a_full_disk_and_stays_ended_after_reload() {
        let Some(fs) = Tmpfs::mount("1m") else {
            eprintln!("skipped: cannot mount a tmpfs (needs root)");
            return;
        };
        let dir = fs.dir.join("tokens");
        let cache = DashMap::new();
        let store = FileStore::open(&dir, &cache).unwrap();
        store.insert(&cache, record("sp_a")).unwrap();
        store.insert(&cache, record("sp_b")).unwrap();
        fill(&fs.dir);
        // Nothing new can be written: a new token fails, the end of a live one does not.
        assert!(store.insert(&cache, record("sp_c")).is_err());
        for _ in 0..3 {
            // Repeatedly: each swap leaves the old file as the next reserve.
            let r = store
                // The undoable form too: it needs no more room than the synced one.
                .update(&cache, "sp_a", false, |r| {
                    r.fork_count += 1;
                })
                .unwrap();
            assert!(r.is_some());
        }
        store
            .update(&cache, "sp_a", true, |r| {
                r.state = TokenState::Revoked;
                r.ended_at = Some(time::OffsetDateTime::now_utc());
            })
            .unwrap();
        store
            .update(&cache, "sp_a", true, |r| r.backend = None)
            .unwrap();
        let reloaded = DashMap::new();
        FileStore::open(&dir, &reloaded).unwrap();
        let a = reloaded.get("sp_a").unwrap();
        assert_eq!(a.state, TokenState::Revoked);
        assert_eq!(a.backend, None);
        assert_eq!(a.fork_count, record("sp_a").fork_count + 3);
        assert_eq!(a.fork_count, 4);
        assert_eq!(reloaded.get("sp_b").unwrap().state, TokenState::Live);
        assert!(reloaded.get("sp_c").is_none());
    }
}
