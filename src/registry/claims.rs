//! The file store's claim journal: a first connection's claim of a backend (a warm-pool
//! member) is one line appended to `claims.log` instead of a token file rewritten and
//! synced, so the first query waits on no disk sync. A process crash (SIGKILL) loses nothing
//! written, and the line is synced soon after by a group commit that serves every claim
//! appended meanwhile; at open the lines are applied to their token files (synced) and the
//! journal emptied. A host crash may lose the newest lines, as it may the scratch server's
//! own data (it runs with `fsync=off`): the token is then unforked and forks anew.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{TokenRecord, TokenState};

/// File name of the journal inside the registry directory.
pub const CLAIMS_FILE: &str = "claims.log";

/// Longest line read back (a line is about 150 bytes; anything longer is not ours).
const MAX_LINE: usize = 4096;

/// One claim: token `token`, whose record had fork count `fork_count`, got `backend`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimLine {
    /// Token id.
    pub token: String,
    /// Provider handle of the claimed backend.
    pub backend: String,
    /// Golden version the backend was copied from.
    pub golden: Option<String>,
    /// The record's fork count before the claim: a line applies once, to that record only.
    pub fork_count: u64,
}

impl ClaimLine {
    /// The line's change, applied to `rec` if it is the record the line was written against
    /// (usable, no backend, same fork count); returns whether it applied. Applying a line
    /// twice, or after the token moved on (ended, reforked), changes nothing.
    pub fn apply(&self, rec: &mut TokenRecord) -> bool {
        if rec.id != self.token
            || !rec.state.is_usable()
            || rec.backend.is_some()
            || rec.fork_count != self.fork_count
        {
            return false;
        }
        claim(rec, &self.backend, self.golden.clone());
        true
    }
}

/// The change a claim makes to a record (the same whether journaled or written whole).
pub fn claim(rec: &mut TokenRecord, backend: &str, golden: Option<String>) {
    rec.backend = Some(backend.to_string());
    rec.golden = golden;
    rec.fork_count += 1;
    // An end that raced the fork keeps its state; its destroy comes next.
    if rec.state == TokenState::Issued {
        rec.state = TokenState::Live;
    }
}

/// The journal file, appended to under the store's write lock, synced by group commit.
pub struct ClaimJournal {
    path: PathBuf,
    file: std::fs::File,
    /// Lines appended so far (this process).
    appended: AtomicU64,
    /// Lines known synced; the mutex makes one caller the sync leader at a time.
    synced: Mutex<u64>,
    /// Bytes in the file now.
    len: AtomicU64,
}

impl ClaimJournal {
    /// Open (create) the journal in `dir` and return it with the lines it holds; a torn
    /// or unreadable line (a crash mid-append) ends the read.
    pub fn open(dir: &Path) -> std::io::Result<(ClaimJournal, Vec<ClaimLine>)> {
        let path = dir.join(CLAIMS_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let bytes = std::fs::read(&path)?;
        let lines = parse(&bytes);
        let j = ClaimJournal {
            path,
            file,
            appended: AtomicU64::new(0),
            synced: Mutex::new(0),
            len: AtomicU64::new(bytes.len() as u64),
        };
        Ok((j, lines))
    }

    /// Append one line (one `write`, no sync); returns its sequence number for
    /// [`ClaimJournal::sync_upto`]. Callers serialise appends (the store's write lock).
    pub fn append(&self, line: &ClaimLine) -> std::io::Result<u64> {
        let mut bytes = serde_json::to_vec(line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        (&self.file).write_all(&bytes)?;
        self.len.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        Ok(self.appended.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Make every line up to `seq` durable. Group commit: the caller that finds the lock
    /// free syncs every line appended so far; callers queued behind it usually find their
    /// line synced already and return without a sync of their own.
    pub fn sync_upto(&self, seq: u64) -> std::io::Result<()> {
        let mut synced = self.synced.lock().unwrap_or_else(|p| p.into_inner());
        if *synced >= seq {
            return Ok(());
        }
        let upto = self.appended.load(Ordering::SeqCst);
        self.file.sync_data()?;
        *synced = upto;
        Ok(())
    }

    /// Bytes in the journal now.
    pub fn bytes(&self) -> u64 {
        self.len.load(Ordering::SeqCst)
    }

    /// Empty the journal (every line is in its token file, synced, by now). Callers hold
    /// the store's write lock, so no append races this. The truncation itself need not be
    /// durable: lines applied again change nothing (see [`ClaimLine::apply`]).
    pub fn clear(&self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.len.store(0, Ordering::SeqCst);
        Ok(())
    }

    /// Where the journal lives.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The whole lines of a journal, up to the first one that does not parse.
fn parse(bytes: &[u8]) -> Vec<ClaimLine> {
    let mut out = Vec::new();
    // Only newline-terminated lines: a line cut short by a crash has no newline yet.
    let mut rest = bytes;
    while let Some(end) = rest.iter().position(|b| *b == b'\n') {
        let (line, tail) = rest.split_at(end);
        rest = &tail[1..];
        if line.len() > MAX_LINE {
            break;
        }
        match serde_json::from_slice::<ClaimLine>(line) {
            Ok(l) => out.push(l),
            // Zeros or garbage after a host crash: nothing after it is trusted.
            Err(_) => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(token: &str, fc: u64) -> ClaimLine {
        ClaimLine {
            token: token.into(),
            backend: format!("pool-{token}"),
            golden: Some("g1".into()),
            fork_count: fc,
        }
    }

    #[test]
    fn torn_and_garbage_tails_end_the_read() {
        let mut b = Vec::new();
        for l in [line("sp_a", 0), line("sp_b", 0)] {
            b.extend(serde_json::to_vec(&l).unwrap());
            b.push(b'\n');
        }
        let whole = b.clone();
        assert_eq!(parse(&whole), vec![line("sp_a", 0), line("sp_b", 0)]);
        // Cut anywhere inside the second line: only the first is read.
        let first_len = whole.iter().position(|c| *c == b'\n').unwrap() + 1;
        for cut in first_len..whole.len() {
            assert_eq!(parse(&whole[..cut]), vec![line("sp_a", 0)], "cut at {cut}");
        }
        // Zeros after a host crash (the size grew, the data did not arrive).
        let mut z = whole[..first_len].to_vec();
        z.extend([0u8; 200]);
        z.push(b'\n');
        z.extend(&whole[first_len..]);
        assert_eq!(parse(&z), vec![line("sp_a", 0)]);
    }

    #[test]
    fn a_line_applies_once_and_only_to_the_record_it_was_written_against() {
        let now = time::OffsetDateTime::now_utc();
        let mut rec = TokenRecord {
            id: "sp_a".into(),
            task: "t".into(),
            metadata: Default::default(),
            created_at: now,
            expires_at: now,
            caps: crate::registry::Caps {
                max_rows: 1,
                max_bytes: 1,
                max_connections: 1,
                cap_mode: crate::registry::CapMode::Truncate,
                allow: None,
                statement_timeout_ms: 0,
                idle_in_transaction_timeout_ms: 0,
            },
            state: TokenState::Issued,
            verifier: crate::auth::Verifier::from_secret("s"),
            backend: None,
            fork_count: 0,
            golden: None,
            superuser: false,
            ended_at: None,
            end: None,
            review_error: None,
            ended_why: None,
        };
        let l = line("sp_a", 0);
        assert!(!line("sp_b", 0).apply(&mut rec), "another token's line");
        assert!(l.apply(&mut rec));
        assert_eq!(rec.backend.as_deref(), Some("pool-sp_a"));
        assert_eq!((rec.fork_count, rec.state), (1, TokenState::Live));
        assert!(!l.apply(&mut rec), "applied twice");
        // The backend vanished and was marked so: an old line does not bring it back.
        rec.backend = None;
        assert!(!l.apply(&mut rec));
        // An ended token is never given a backend.
        let mut ended = rec.clone();
        ended.fork_count = 0;
        ended.state = TokenState::Revoked;
        assert!(!l.apply(&mut ended));
    }
}
