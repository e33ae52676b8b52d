//! Where a token's statement log lives, and the files a reader takes it from: one file in
//! the data dir (one gateway, the default), or, for fronts sharing a registry, one file per
//! front in a directory every front mounts (`registry.shared_dir`), read as one log.
//!
//! Why a file per front: each front appends to a file no other process writes, so the
//! write-ahead record costs what it costs on one gateway (one `write(2)`, no lock shared
//! between machines, no round trip); the merge is paid by readers, which are rare.

use std::path::{Path, PathBuf};

use super::{log_path, merge, read, LogEntry, LogError, Page, StatementRecord};

/// Where a gateway's statement logs are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogPlace {
    /// `<data dir>/logs/<task>/<token>.jsonl`: this gateway's alone.
    Local(PathBuf),
    /// `<shared dir>/logs/<task>/<token>/<front>.jsonl`: one file per front.
    Shared(PathBuf),
}

/// One front's file of a token's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontFile {
    /// The front's id (its data dir's `gateway.id`).
    pub front: String,
    /// Its file.
    pub path: PathBuf,
}

/// The files of one token's log, as a reader finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogFiles {
    /// One gateway's file (it may not exist yet).
    Single(PathBuf),
    /// The fronts' files, ordered by front id (none yet: nothing logged).
    Fronts(Vec<FrontFile>),
}

/// Whether `s` may name a front's file: what `gateway.id` holds (hex), bounded, so a name
/// in the shared directory never reaches outside it.
pub fn is_front_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The directory holding a token's front files under a shared directory.
pub fn fronts_dir(shared: &Path, task: &str, token: &str) -> PathBuf {
    shared.join("logs").join(task).join(token)
}

/// The file one front writes for a token under a shared directory.
pub fn front_path(shared: &Path, task: &str, token: &str, front: &str) -> PathBuf {
    fronts_dir(shared, task, token).join(format!("{front}.jsonl"))
}

impl LogPlace {
    /// The files a token's log is read from.
    pub fn files(&self, task: &str, token: &str) -> Result<LogFiles, LogError> {
        match self {
            LogPlace::Local(data_dir) => Ok(LogFiles::Single(log_path(data_dir, task, token))),
            LogPlace::Shared(shared) => {
                let dir = fronts_dir(shared, task, token);
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Ok(LogFiles::Fronts(Vec::new()))
                    }
                    Err(source) => return Err(LogError::Io { path: dir, source }),
                };
                let mut files = Vec::new();
                for e in entries {
                    let e = e.map_err(|source| LogError::Io {
                        path: dir.clone(),
                        source,
                    })?;
                    let name = e.file_name();
                    let Some(front) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) else {
                        continue;
                    };
                    if is_front_id(front) {
                        files.push(FrontFile {
                            front: front.to_string(),
                            path: e.path(),
                        });
                    }
                }
                files.sort_by(|a, b| a.front.cmp(&b.front));
                Ok(LogFiles::Fronts(files))
            }
        }
    }
}

impl LogFiles {
    /// Up to `limit` statements after `after`, with their outcomes (see [`read::read_page`]);
    /// for fronts' files, `after` and each `seq` are positions in the merged order
    /// (see `merge`).
    pub fn read_page(&self, after: u64, limit: usize) -> Result<Page, LogError> {
        match self {
            LogFiles::Single(p) => read::read_page(p, after, limit),
            LogFiles::Fronts(f) => merge::page(f, after, limit, read::PAGE_BYTES_MAX),
        }
    }

    /// Every statement with its outcome (holds them all: small logs, tests).
    pub fn read_statements(&self) -> Result<Vec<super::LoggedStatement>, LogError> {
        match self {
            LogFiles::Single(p) => read::read_statements(p),
            LogFiles::Fronts(f) => Ok(merge::page(f, 0, usize::MAX, usize::MAX)?.statements),
        }
    }

    /// Call `f` with every record, in file order for one file, in the merged order for
    /// fronts' files (their `seq` renumbered to merged positions); with each, the index of
    /// the file it came from (for [`LogFiles::statement_at`]).
    pub fn scan(&self, mut f: impl FnMut(usize, LogEntry)) -> Result<(), LogError> {
        match self {
            LogFiles::Single(p) => read::scan(p, |e| f(0, e)),
            LogFiles::Fronts(files) => merge::scan(files, |m| {
                f(m.file, m.entry);
                true
            }),
        }
    }

    /// The statement record whose line starts at `offset` of file `file` (as its file holds
    /// it: for fronts' files, `seq` is the front's own).
    pub fn statement_at(
        &self,
        file: usize,
        offset: u64,
    ) -> Result<Option<StatementRecord>, LogError> {
        match self.paths().get(file) {
            Some(p) => read::statement_at(p, offset),
            None => Ok(None),
        }
    }

    /// The files, in the order [`LogFiles::scan`] numbers them.
    pub fn paths(&self) -> Vec<&Path> {
        match self {
            LogFiles::Single(p) => vec![p.as_path()],
            LogFiles::Fronts(f) => f.iter().map(|f| f.path.as_path()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_ids_are_plain_names() {
        assert!(is_front_id("0123abcdef456789"));
        for bad in ["", "..", "a/b", "a.b", &"a".repeat(65), "a b"] {
            assert!(!is_front_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn shared_place_lists_front_files_by_id_and_skips_others() {
        let tmp = tempfile::tempdir().unwrap();
        let place = LogPlace::Shared(tmp.path().to_path_buf());
        assert_eq!(
            place.files("t", "tok").unwrap(),
            LogFiles::Fronts(Vec::new())
        );
        let dir = fronts_dir(tmp.path(), "t", "tok");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["bbb.jsonl", "aaa.jsonl", "notes.txt", "x.y.jsonl", ".jsonl"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let LogFiles::Fronts(f) = place.files("t", "tok").unwrap() else {
            panic!("fronts")
        };
        let names: Vec<_> = f.iter().map(|f| f.front.as_str()).collect();
        assert_eq!(names, ["aaa", "bbb"]);
        assert_eq!(f[0].path, front_path(tmp.path(), "t", "tok", "aaa"));
    }

    #[test]
    fn local_place_is_the_one_file_of_one_gateway() {
        let p = LogPlace::Local(PathBuf::from("/d"));
        assert_eq!(
            p.files("t", "tok").unwrap(),
            LogFiles::Single(PathBuf::from("/d/logs/t/tok.jsonl"))
        );
    }
}
