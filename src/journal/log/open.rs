//! Opening a token's log: its directory made private, the sequence continued from the last
//! record, a mapped tail's zeros cut off, a new file begun with its version header.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};

use super::{
    defs, fill_level, intern, line, log_path, mapped, others, place, read, LogError, TokenLog,
    Writer,
};

impl TokenLog {
    /// Open (create) the log of a token, continuing its sequence numbers; statement records
    /// that would take it past `max_bytes` (0 = no limit) are refused.
    pub fn open(
        data_dir: &Path,
        task: &str,
        token: &str,
        max_bytes: u64,
    ) -> Result<TokenLog, LogError> {
        let path = log_path(data_dir, task, token);
        let base = data_dir.join("logs");
        TokenLog::open_file(&base, Path::new(task), path, task, token, max_bytes)
    }

    /// Open (create) this front's file of a token's log under a shared directory (see
    /// [`place`](LogPlace)): `<shared>/logs/<task>/<token>/<front>.jsonl`, no other process
    /// writing it.
    pub fn open_front(
        shared: &Path,
        front: &str,
        task: &str,
        token: &str,
        max_bytes: u64,
    ) -> Result<TokenLog, LogError> {
        let path = place::front_path(shared, task, token, front);
        let rel = Path::new(task).join(token);
        let mut log =
            TokenLog::open_file(&shared.join("logs"), &rel, path, task, token, max_bytes)?;
        if max_bytes > 0 {
            log.siblings = Some(place::fronts_dir(shared, task, token));
            let w = log.writer.get_mut().unwrap_or_else(|p| p.into_inner());
            // Summed at open (a front joining late starts from what the others wrote).
            others::resum(w, log.siblings.as_deref(), &log.path, max_bytes);
            let total = w.others + w.len;
            log.fill = std::sync::atomic::AtomicU8::new(fill_level(total, max_bytes).unwrap_or(0));
        }
        Ok(log)
    }

    /// Open (create) the log file at `path`, which lies in `base/rel` (made private).
    fn open_file(
        base: &Path,
        rel: &Path,
        path: PathBuf,
        task: &str,
        token: &str,
        max_bytes: u64,
    ) -> Result<TokenLog, LogError> {
        let io = |source| LogError::Io {
            path: path.clone(),
            source,
        };
        crate::datadir::private_dirs(base, rel).map_err(io)?;
        let last = read::last_seq(&path)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        // A log that was mapped when the gateway died ends in its reservation's zeros.
        let len = mapped::data_end(&file).map_err(io)?;
        if len < file.metadata().map_err(io)?.len() {
            file.set_len(len).map_err(io)?;
        }
        let mut torn = len > 0 && last_byte(&file, len).map_err(io)? != b'\n';
        let (intern, len) = match defs::header_of(&file).map_err(io)? {
            Some(h) => (
                Some(intern::Interner::new(&h.token, &h.task, h.epoch_ns)),
                len,
            ),
            None if len == 0 => {
                // A new log: version 2, its times counted from now.
                let i = intern::Interner::new(token, task, line::now_ns());
                let mut head = Vec::new();
                i.header_line(&mut head);
                (&file).write_all(&head).map_err(|source| {
                    let _ = file.set_len(0);
                    io(source)
                })?;
                torn = false;
                (Some(i), head.len() as u64)
            }
            None => (None, len),
        };
        let file = Arc::new(file);
        Ok(TokenLog {
            path,
            synced: file.clone(),
            writer: Mutex::new(Writer {
                file,
                len,
                torn,
                turn: last,
                waiters: 0,
                line: Vec::with_capacity(512),
                pending: Vec::with_capacity(512),
                carried: 0,
                seen: None,
                escaped: line::EscapeCache::default(),
                intern,
                tail: None,
                writes: 0,
                writes_at_tick: 0,
                others: 0,
                resum_at: 0,
            }),
            turns: Condvar::new(),
            seq: AtomicU64::new(last),
            dirty: AtomicBool::new(false),
            max_bytes,
            siblings: None,
            // A log reopened past a level warns its new sessions too.
            fill: std::sync::atomic::AtomicU8::new(if max_bytes > 0 {
                fill_level(len, max_bytes).unwrap_or(0)
            } else {
                0
            }),
        })
    }
}

/// The byte before `len` (a file that does not end in a newline ends in a torn record).
fn last_byte(f: &std::fs::File, len: u64) -> std::io::Result<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, len - 1)?;
    Ok(b[0])
}
