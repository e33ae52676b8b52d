//! The embedded token store: one JSON file per token in the data dir, written atomically and
//! fsynced, so a write that returned survives a crash. One gateway process owns it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dashmap::DashMap;

use super::{RegistryError, TokenRecord};

/// Token files under one directory.
pub struct FileStore {
    dir: PathBuf,
    // Serialises file writes so an older state can never overwrite a newer one.
    write_lock: Mutex<()>,
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
        Ok(FileStore {
            dir: dir.to_path_buf(),
            write_lock: Mutex::new(()),
        })
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

    /// Change a token and persist it; returns the new record (None if unknown).
    pub fn update(
        &self,
        cache: &DashMap<String, TokenRecord>,
        id: &str,
        f: impl FnOnce(&mut TokenRecord),
    ) -> Result<Option<TokenRecord>, RegistryError> {
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut rec) = cache.get(id).map(|r| r.clone()) else {
            return Ok(None);
        };
        f(&mut rec);
        self.persist(&rec)?;
        cache.insert(id.to_string(), rec.clone());
        Ok(Some(rec))
    }

    fn persist(&self, rec: &TokenRecord) -> Result<(), RegistryError> {
        let path = self.dir.join(format!("{}.json", rec.id));
        let tmp = self.dir.join(format!("{}.json.tmp", rec.id));
        let io = |source| RegistryError::Io {
            path: path.clone(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(rec).map_err(|e| RegistryError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode_0600()
                .open(&tmp)
                .map_err(io)?;
            f.write_all(&bytes).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, &path).map_err(io)?;
        // The rename is durable only once the directory is synced.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        Ok(())
    }
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}
