//! The open logs of the process ([`LogBook`], one [`TokenLog`] per token) and the ticker
//! thread that writes idle logs' deferred outcomes, maps and releases busy logs, and fsyncs
//! them ([`SyncTicker`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use dashmap::DashMap;

use super::{LogError, TokenLog, DEFAULT_MAX_BYTES_PER_TOKEN};

/// The open logs of this process, one per token.
pub struct LogBook {
    logs: DashMap<String, Arc<TokenLog>>,
    max_bytes: AtomicU64,
    /// Set for a front sharing its logs: the shared directory and this front's id.
    shared: OnceLock<(PathBuf, String)>,
}

impl Default for LogBook {
    fn default() -> Self {
        LogBook {
            logs: DashMap::new(),
            max_bytes: AtomicU64::new(DEFAULT_MAX_BYTES_PER_TOKEN),
            shared: OnceLock::new(),
        }
    }
}

impl LogBook {
    /// Set the per-token quota (`log.max_bytes_per_token`, 0 = none) of logs opened from now on.
    pub fn set_max_bytes_per_token(&self, max: u64) {
        self.max_bytes.store(max, Ordering::Release);
    }

    /// Write logs from now on as front `front`'s files under the shared directory `dir`
    /// (`registry.shared_dir`), not in the data dir; set once, before any log is opened.
    pub fn share(&self, dir: PathBuf, front: String) -> Result<(), LogError> {
        if !super::is_front_id(&front) {
            return Err(LogError::Io {
                path: dir,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{front:?} cannot name a front's log file"),
                ),
            });
        }
        let _ = self.shared.set((dir, front));
        Ok(())
    }

    /// The log of a token, opened on first use.
    pub fn get(&self, data_dir: &Path, task: &str, token: &str) -> Result<Arc<TokenLog>, LogError> {
        if let Some(l) = self.logs.get(token) {
            return Ok(l.clone());
        }
        let max = self.max_bytes.load(Ordering::Acquire);
        let log = Arc::new(match self.shared.get() {
            Some((dir, front)) => TokenLog::open_front(dir, front, task, token, max)?,
            None => TokenLog::open(data_dir, task, token, max)?,
        });
        Ok(self.logs.entry(token.to_string()).or_insert(log).clone())
    }

    /// Write the deferred outcome records of a token's log, if it is open (before reading
    /// it in this process, so a reader sees every outcome already known).
    pub fn flush(&self, token: &str) {
        if let Some(l) = self.logs.get(token) {
            if let Err(e) = l.flush_outcomes() {
                tracing::warn!(error = %e, "statement log write failed");
            }
        }
    }

    /// [`TokenLog::flush_idle_outcomes`] and [`TokenLog::adapt`] of every open log.
    pub fn flush_idle(&self) {
        for l in self.logs.iter() {
            if let Err(e) = l.flush_idle_outcomes() {
                tracing::warn!(error = %e, "statement log write failed");
            }
            l.adapt();
        }
    }

    /// Sync every open log and cut off the reserved tails of mapped ones (the gateway stops);
    /// returns how many there were.
    pub fn release_all(&self) -> usize {
        let mut n = 0;
        for l in self.logs.iter() {
            if let Err(e) = l.sync() {
                tracing::warn!(error = %e, "statement log sync failed");
            }
            l.release();
            n += 1;
        }
        n
    }

    /// Write deferred outcomes and fsync every log with unsynced records.
    pub fn sync_all(&self) {
        for l in self.logs.iter() {
            if let Err(e) = l.sync() {
                tracing::warn!(error = %e, "statement log sync failed");
            }
        }
    }

    /// Sync and forget a token's log (token ended).
    pub fn close(&self, token: &str) {
        if let Some((_, l)) = self.logs.remove(token) {
            if let Err(e) = l.sync() {
                tracing::warn!(error = %e, "statement log sync failed");
            }
            l.release();
        }
    }
}

/// How often [`SyncTicker`] fsyncs the open logs.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// How often idle logs' deferred outcome records are looked at: written after one to two
/// of these with no write (see [`TokenLog::flush_idle_outcomes`]).
pub const OUTCOME_IDLE: Duration = Duration::from_millis(75);

/// Every [`OUTCOME_IDLE`], writes the deferred outcomes of logs gone idle; every
/// [`SYNC_INTERVAL`], fsyncs the logs `book` finds in `owner`; until [`SyncTicker::stop`]
/// (or drop). Statement records are written before each statement runs (SIGKILL-safe); the
/// fsync makes them survive a machine crash too, at most a second late. Done here rather
/// than by a timer in each relay loop: a timer polled at every wake-up of a busy session
/// cost more than the write it saved. A thread of its own, not a task: a tick then costs
/// one timed wait, where a runtime timer woke the event loop through several syscalls
/// (counted against every transaction of a busy gateway).
pub struct SyncTicker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SyncTicker {
    /// Starts the ticker thread (`sandpit-log-ticker`).
    pub fn start<T: Send + Sync + 'static>(
        owner: Arc<T>,
        book: fn(&T) -> &LogBook,
    ) -> std::io::Result<SyncTicker> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("sandpit-log-ticker".into())
            .spawn(move || {
                let (lock, cvar) = &*flag;
                let mut last_sync = std::time::Instant::now();
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                while !*stopped {
                    stopped = cvar
                        .wait_timeout(stopped, OUTCOME_IDLE)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if *stopped {
                        break;
                    }
                    drop(stopped);
                    // A write of a few records, as the relay does inline for each statement.
                    book(&owner).flush_idle();
                    if last_sync.elapsed() >= SYNC_INTERVAL {
                        last_sync = std::time::Instant::now();
                        book(&owner).sync_all();
                    }
                    stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                }
            })?;
        Ok(SyncTicker {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (a flush or fsync under way finishes first).
    pub fn stop(&mut self) {
        let (lock, cvar) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cvar.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SyncTicker {
    fn drop(&mut self) {
        self.stop();
    }
}
