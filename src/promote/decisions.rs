//! The review record of one token, kept next to its stored review
//! (`<reviews dir>/<task>/<token>.promote.json`, mode 0600): its state, the audit trail of
//! who decided what and when, the validators' results, what was captured for promotion, and
//! every promotion attempt. Read-modify-write under one process-wide lock (and, for fronts
//! sharing the directory, a lock file of the token's: `across`); written to a
//! temporary file and renamed, so a crash leaves the old or the new record, never half.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::plan::Counts;
use super::validators::ValidatorResult;

/// Where a token's review stands.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReviewState {
    /// Nobody has decided yet.
    #[default]
    NeedsReview,
    /// Approved: may be promoted.
    Approved,
    /// Rejected: will not be promoted (until approved after all).
    Rejected,
    /// Applied to a target.
    Promoted,
}

impl ReviewState {
    /// Words for a person.
    pub fn words(self) -> &'static str {
        match self {
            ReviewState::NeedsReview => "needs review",
            ReviewState::Approved => "approved",
            ReviewState::Rejected => "rejected",
            ReviewState::Promoted => "promoted",
        }
    }
}

/// One entry of the audit trail.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// RFC 3339.
    pub at: String,
    /// Who: `admin` or `reviewer:<name>`.
    pub by: String,
    /// approved, rejected, promoted, promote-dry-run, promote-conflicts, promote-refused,
    /// promote-failed.
    pub action: String,
    /// The reviewer's comment, or what happened.
    pub comment: String,
}

/// What was kept for promotion when the token ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CaptureInfo {
    /// Whether every changed row is held (promotion needs it).
    pub complete: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Changed rows, all tables.
    pub rows: u64,
    /// Schema changes.
    pub schema_changes: usize,
    /// Masked columns of the golden (`schema.table.column`).
    pub masked: Vec<String>,
    /// The source the golden was built from (no secret), kept so the default target
    /// survives the golden version's removal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_conninfo: Option<String>,
    /// Why the change cannot be promoted, found when the token ended (blocks approval).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
}

/// One promotion attempt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PromoteReport {
    /// applied, dry_run (would apply), conflicts, refused, failed.
    pub outcome: String,
    /// The target, without its password.
    pub target: String,
    /// Role the change was applied as (None: the login role).
    pub role: Option<String>,
    /// Whether it was a dry run (nothing committed either way).
    pub dry_run: bool,
    /// RFC 3339.
    pub at: String,
    /// Who asked.
    pub by: String,
    /// What the change holds.
    pub counts: Counts,
    /// Rows and objects that moved in the target since the golden (nothing was applied).
    pub conflicts: Vec<String>,
    /// Conflicts in all (the list is capped).
    pub conflicts_total: usize,
    /// Why the change cannot be promoted.
    pub refusals: Vec<String>,
    /// What went wrong, for `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The review record of one token.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ReviewRecord {
    /// Token id.
    pub token: String,
    /// Task name.
    pub task: String,
    /// Golden version of its scratch database.
    pub golden: Option<String>,
    /// Current state.
    pub state: ReviewState,
    /// Who decided what and when, oldest first.
    pub trail: Vec<Event>,
    /// Validators' results (run when the token ended).
    pub validators: Vec<ValidatorResult>,
    /// When the validators ran.
    pub validated_at: Option<String>,
    /// What was captured for promotion.
    pub capture: Option<CaptureInfo>,
    /// Promotion attempts, oldest first.
    pub promotions: Vec<PromoteReport>,
    /// A promotion under way (written before it starts, cleared when it ends): one left
    /// here by a gateway that stopped becomes a `promote-interrupted` entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoting: Option<Event>,
}

impl ReviewRecord {
    /// A fresh record.
    pub fn new(token: &str, task: &str, golden: Option<String>) -> ReviewRecord {
        ReviewRecord {
            token: token.into(),
            task: task.into(),
            golden,
            ..Default::default()
        }
    }

    /// Turns a promotion left under way into a `promote-interrupted` audit entry (true
    /// when there was one).
    pub fn settle_interrupted(&mut self) -> bool {
        let Some(started) = self.promoting.take() else {
            return false;
        };
        self.trail.push(Event {
            at: now(),
            by: started.by.clone(),
            action: "promote-interrupted".into(),
            comment: format!(
                "the promotion to {} started at {} did not finish (the gateway stopped): its \
                 transaction was rolled back by the target, unless the stop came during COMMIT \
                 itself; compare the target with the review before promoting again",
                started.comment, started.at
            ),
        });
        true
    }

    /// Validators that failed.
    pub fn failed_validators(&self) -> Vec<&ValidatorResult> {
        self.validators.iter().filter(|v| !v.passed).collect()
    }
}

/// Errors reading or writing a record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("review record {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("review record {path} does not parse: {message}")]
    Parse { path: PathBuf, message: String },
}

/// Serialises read-modify-write of records in this process.
static LOCK: Mutex<()> = Mutex::new(());

/// Path of a token's record under the reviews dir.
pub fn path(dir: &Path, task: &str, token: &str) -> PathBuf {
    dir.join(task).join(format!("{token}.promote.json"))
}

/// The record, if one was written.
pub fn load(dir: &Path, task: &str, token: &str) -> Result<Option<ReviewRecord>, RecordError> {
    let p = path(dir, task, token);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| RecordError::Parse {
                path: p,
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RecordError::Io { path: p, source }),
    }
}

/// Write `bytes` to `path` atomically (mode 0600, directories private).
pub fn write_private(dir: &Path, rel_dir: &str, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::datadir::private_dirs(dir, Path::new(rel_dir))?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Read, change and write a token's record (created when missing). `f` may refuse the
/// change by returning an error, and then nothing is written.
pub fn update<T, E: From<RecordError>>(
    dir: &Path,
    task: &str,
    token: &str,
    golden: Option<String>,
    f: impl FnOnce(&mut ReviewRecord) -> Result<T, E>,
) -> Result<(T, ReviewRecord), E> {
    let _held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    // And across fronts sharing the directory (held for one read and one write).
    let _across =
        super::across::lock(dir, task, token, super::across::Kind::Record).map_err(|source| {
            RecordError::Io {
                path: path(dir, task, token),
                source,
            }
        })?;
    let mut rec = load(dir, task, token)?.unwrap_or_else(|| ReviewRecord::new(token, task, golden));
    let out = f(&mut rec)?;
    let p = path(dir, task, token);
    let bytes = serde_json::to_vec_pretty(&rec).unwrap_or_default();
    write_private(dir, task, &p, &bytes).map_err(|source| RecordError::Io { path: p, source })?;
    Ok((out, rec))
}

/// Current time, RFC 3339.
pub fn now() -> String {
    crate::rfc3339::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reload_and_refusals_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (_, rec) = update::<_, RecordError>(dir.path(), "task", "tok", None, |r| {
            r.state = ReviewState::Approved;
            r.trail.push(Event {
                at: now(),
                by: "reviewer:alice".into(),
                action: "approved".into(),
                comment: "fine".into(),
            });
            Ok(())
        })
        .unwrap();
        assert_eq!(load(dir.path(), "task", "tok").unwrap(), Some(rec.clone()));
        #[derive(Debug)]
        struct No;
        impl From<RecordError> for No {
            fn from(_: RecordError) -> No {
                No
            }
        }
        let r: Result<((), ReviewRecord), No> = update(dir.path(), "task", "tok", None, |r| {
            r.state = ReviewState::Rejected;
            Err(No)
        });
        assert!(r.is_err());
        assert_eq!(load(dir.path(), "task", "tok").unwrap(), Some(rec));
    }
}
