//! Reviews of tokens: taken live (API), or at the end of a token just before its backend is
//! destroyed and kept under `<data dir>/reviews/<task>/<token>.{json,txt,sql,html}` next to
//! the statement log, so they outlive the backend.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::diff::{self, DiffOptions};
use super::escape::cap;
use super::model::{FailedStatement, Review, ScanInfo, StatementSummary, Verification};
use super::reviewer::Reviewer;
use super::{html, render, verify};
use crate::journal::log::{self, LoggedStatement};
use crate::registry::end::crash_point;
use crate::registry::TokenRecord;

/// Longest statement text kept in a failure summary.
const FAILED_TEXT_MAX: usize = 500;
/// Failed statements listed in a summary (the log itself has all of them).
const FAILED_MAX: usize = 10_000;
/// Statements read for the HTML page (it lists up to 1000).
const PAGE_STATEMENTS: usize = 1000;

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The [`Review`] as JSON.
    Json,
    /// For a person, plain text.
    Text,
    /// The SQL patch.
    Sql,
    /// One self-contained HTML page.
    Html,
}

impl Format {
    /// Parse `json|text|sql|html`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "json" => Some(Format::Json),
            "text" | "txt" => Some(Format::Text),
            "sql" => Some(Format::Sql),
            "html" => Some(Format::Html),
            _ => None,
        }
    }

    /// File extension of the stored file.
    pub fn ext(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Text => "txt",
            Format::Sql => "sql",
            Format::Html => "html",
        }
    }

    /// HTTP content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Text => "text/plain; charset=utf-8",
            Format::Sql => "application/sql; charset=utf-8",
            Format::Html => "text/html; charset=utf-8",
        }
    }
}

/// Errors taking a review.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error(transparent)]
    Db(#[from] super::conn::ConnError),
    #[error("backend: {0}")]
    Backend(String),
    #[error(transparent)]
    Log(#[from] log::LogError),
    #[error("writing review {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Path of a stored review file under `dir` (see [`reviews_dir`]).
pub fn review_path(dir: &Path, task: &str, token: &str, f: Format) -> PathBuf {
    dir.join(task).join(format!("{token}.{}", f.ext()))
}

/// Counts by kind and the failures of a statement log.
pub fn summarize(stmts: &[LoggedStatement]) -> StatementSummary {
    let mut s = StatementSummary::default();
    for st in stmts {
        s.total += 1;
        *s.by_kind.entry(st.statement.kind.clone()).or_insert(0) += 1;
        match &st.outcome {
            None => s.unfinished += 1,
            Some(o) => {
                if let Some(code) = &o.sqlstate {
                    s.failed.push(FailedStatement {
                        seq: st.statement.seq,
                        kind: st.statement.kind.clone(),
                        text: cap(&st.statement.text, FAILED_TEXT_MAX),
                        sqlstate: code.clone(),
                    });
                }
            }
        }
    }
    s
}

fn options(rv: &Reviewer) -> DiffOptions {
    let r = &rv.settings;
    DiffOptions {
        statement_timeout: r.statement_timeout,
        settle_timeout: r.settle_timeout,
        samples: r.samples,
        ..DiffOptions::default()
    }
}

/// The first statements of the token's log, as many as the HTML page lists (the summary
/// counts all of them: [`summarize_log`]).
pub fn statements(rv: &Reviewer, rec: &TokenRecord) -> Result<Vec<LoggedStatement>, ReviewError> {
    let files = rv.logs.files(&rec.task, &rec.id)?;
    Ok(files.read_page(0, PAGE_STATEMENTS)?.statements)
}

/// [`summarize`] of a whole log (one file, or the fronts' files merged), read as a stream:
/// what it holds per statement until the statement's outcome arrives is its sequence number
/// and where its line starts, and the text of a failed statement is read back from there
/// (at most [`FAILED_MAX`] of them).
pub fn summarize_log(files: &log::LogFiles) -> Result<StatementSummary, log::LogError> {
    let mut s = StatementSummary::default();
    // Counted by kind once the outcome is known: the server's tags decide (see
    // `log::settled_kind`); statements that never completed count as guessed.
    let mut pending: std::collections::HashMap<u64, (usize, u64, String)> = Default::default();
    // (file, offset, seq as the reader numbers it, SQLSTATE)
    let mut failed: Vec<(usize, u64, u64, String)> = Vec::new();
    let count = |s: &mut StatementSummary, kind: String| match s.by_kind.get_mut(&kind) {
        Some(n) => *n += 1,
        None => {
            s.by_kind.insert(kind, 1);
        }
    };
    files.scan(|file, e| match e {
        log::LogEntry::Statement {
            offset, statement, ..
        } => {
            s.total += 1;
            pending.insert(statement.seq, (file, offset, statement.kind));
        }
        log::LogEntry::Outcome(o) => {
            if let Some((file, offset, lexical)) = pending.remove(&o.seq) {
                count(&mut s, log::settled_kind(lexical, Some(&o)));
                if let Some(code) = o.sqlstate {
                    if failed.len() < FAILED_MAX {
                        failed.push((file, offset, o.seq, code));
                    }
                }
            }
        }
    })?;
    s.unfinished = pending.len() as u64;
    for (_, (_, _, lexical)) in pending {
        count(&mut s, lexical);
    }
    for (file, offset, seq, sqlstate) in failed {
        if let Some(st) = files.statement_at(file, offset)? {
            s.failed.push(FailedStatement {
                seq,
                kind: st.kind,
                text: cap(&st.text, FAILED_TEXT_MAX),
                sqlstate,
            });
        }
    }
    Ok(s)
}

/// Take a review now (`full_scan`: compare every table, not only touched ones). A token that
/// never connected has no scratch database and so no changes; nothing is forked for it.
pub async fn take(
    rv: &Reviewer,
    rec: &TokenRecord,
    full_scan: bool,
) -> Result<Review, ReviewError> {
    take_verified(rv, rec, full_scan, false).await
}

/// [`take`], and with `verify` the patch replayed on a fresh fork of the golden
/// ([`super::verify`]).
pub async fn take_verified(
    rv: &Reviewer,
    rec: &TokenRecord,
    full_scan: bool,
    verify: bool,
) -> Result<Review, ReviewError> {
    let why_not = (!verify).then(|| "not asked for (verify=true asks for it)".to_string());
    take_with(rv, rec, full_scan, false, why_not).await
}

async fn take_with(
    rv: &Reviewer,
    rec: &TokenRecord,
    full_scan: bool,
    end_sessions: bool,
    no_verify: Option<String>,
) -> Result<Review, ReviewError> {
    let files = rv.logs.files(&rec.task, &rec.id)?;
    let summary = tokio::task::spawn_blocking(move || summarize_log(&files))
        .await
        .map_err(|e| ReviewError::Backend(format!("log summary task: {e}")))??;
    let mut review = match rec.backend.as_deref() {
        None => Review {
            token: rec.id.clone(),
            task: rec.task.clone(),
            generated_at: crate::rfc3339::now(),
            scan: ScanInfo {
                mode: "none".into(),
                reason: Some("the token never connected: no scratch database exists".into()),
                ..Default::default()
            },
            patch: String::new(),
            verification: Some(Verification::not_verified(
                "the token never connected: there is no scratch database to rebuild",
            )),
            ..Default::default()
        },
        Some(handle) => {
            let scratch = if end_sessions {
                rv.provider.ended_backend(handle).await
            } else {
                rv.provider.ensure_running(handle).await
            }
            .map_err(|e| ReviewError::Backend(e.to_string()))?;
            let reference = rv
                .provider
                .reference(rec.golden.as_deref())
                .await
                .map_err(|e| ReviewError::Backend(e.to_string()))?;
            // A superuser session could have forged the evidence a skipped table rests on
            // (`super::touched`): every table is read.
            let opts = DiffOptions {
                full_scan: full_scan || rec.superuser,
                end_sessions,
                ..options(rv)
            };
            // The review's own login, never the agent's (whose role settings the agent
            // controls).
            let target = rv.provider.review_target(&scratch);
            let mut r = diff::diff(&reference.target, &target, opts, &rec.id, &rec.task).await?;
            if rec.superuser && !full_scan {
                r.scan.reason = Some("the token's sessions were superusers".into());
            }
            r.verification = Some(match no_verify {
                Some(why) => Verification::not_verified(why),
                None => verify::check(rv, rec, &scratch, &r.patch).await,
            });
            r
        }
    };
    review.statements = summary;
    metrics::histogram!("sandpit_review_seconds").record(review.duration_ms / 1000.0);
    Ok(review)
}

/// Render a review in a format.
pub fn render(review: &Review, stmts: &[LoggedStatement], f: Format) -> String {
    match f {
        Format::Json => serde_json::to_string_pretty(review).unwrap_or_default(),
        Format::Text => render::text(review),
        Format::Sql => review.patch.clone(),
        Format::Html => html::page(review, stmts),
    }
}

/// The file reserved at issue for one format of a token's review ([`reserve`]).
fn reserve_path(dir: &Path, task: &str, token: &str, f: Format) -> PathBuf {
    dir.join(task).join(format!("{token}.{}.reserve", f.ext()))
}

/// Reserves `review.reserve_bytes` on disk for a token's end-of-token review, a quarter per
/// format, as files whose blocks are allocated now ([`write_all`] writes into them). Called
/// when a token is issued; a failure is logged (the review is then written without a
/// reserve).
pub fn reserve(rv: &Reviewer, task: &str, token: &str) {
    let per = rv.settings.reserve_bytes / 4;
    if !rv.settings.on_end || per == 0 {
        return;
    }
    let made = (|| -> std::io::Result<()> {
        crate::datadir::private_dirs(&rv.dir, Path::new(task))?;
        for f in [Format::Json, Format::Text, Format::Sql, Format::Html] {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(reserve_path(&rv.dir, task, token, f))?;
            nix::fcntl::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                nix::fcntl::FallocateFlags::empty(),
                0,
                per as i64,
            )
            .map_err(std::io::Error::from)?;
            file.sync_all()?;
        }
        Ok(())
    })();
    if let Err(e) = made {
        tracing::warn!(token, error = %e, "reserving disk space for the review failed");
    }
}

/// Removes the space [`reserve`] kept for a review that will never be written (the token's
/// scratch data was discarded).
pub fn release_reserve(rv: &Reviewer, task: &str, token: &str) {
    for f in [Format::Json, Format::Text, Format::Sql, Format::Html] {
        match std::fs::remove_file(reserve_path(&rv.dir, task, token, f)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(token, error = %e, "removing a review reserve failed")
            }
            _ => {}
        }
    }
}

/// Write all four files of a review under `dir` (mode 0600: they quote data), each into the
/// space [`reserve`] kept for it when there is one (its blocks are overwritten, then the
/// file is cut to the review's length and renamed), else into a new file.
pub fn write_all(
    dir: &Path,
    review: &Review,
    stmts: &[LoggedStatement],
) -> Result<(), ReviewError> {
    for f in [Format::Json, Format::Text, Format::Sql, Format::Html] {
        let path = review_path(dir, &review.task, &review.token, f);
        let write = || -> std::io::Result<()> {
            crate::datadir::private_dirs(dir, Path::new(&review.task))?;
            let reserved = reserve_path(dir, &review.task, &review.token, f);
            let tmp = if reserved.exists() {
                reserved
            } else {
                path.with_extension(format!("{}.tmp", f.ext()))
            };
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&tmp)?;
            let bytes = render(review, stmts, f);
            file.write_all(bytes.as_bytes())?;
            file.set_len(bytes.len() as u64)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            crash_point(&format!("review:wrote_{}", f.ext()));
            Ok(())
        };
        write().map_err(|source| ReviewError::Write {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// A stored review file under `dir`, if one was written.
pub fn load(dir: &Path, task: &str, token: &str, f: Format) -> Option<String> {
    std::fs::read_to_string(review_path(dir, task, token, f)).ok()
}

/// Called after a fork (a lifecycle hook set up by `server/run.rs`): start the reference in the
/// background, so the review at the end of the token does not wait for it (it is started
/// once and kept).
pub fn prepare(rv: &Reviewer, golden: Option<String>) {
    if rv.settings.on_end {
        let provider = rv.provider.clone();
        tokio::spawn(async move {
            if let Err(e) = provider.reference(golden.as_deref()).await {
                tracing::warn!(error = %e, "starting the review reference failed");
            }
        });
    }
}

/// Called before an ended token's backend is destroyed (a lifecycle hook set up by
/// `server/run.rs`), when `review.on_end` is set: end the agent's sessions and roll back its
/// prepared transactions (nothing of the agent's may hold the review back), take the review
/// and store it. An error says why no review was stored; the backend is then kept and the
/// review tried again.
pub async fn on_end(rv: &Reviewer, rec: &TokenRecord) -> Result<(), String> {
    if !rv.settings.on_end {
        return Ok(());
    }
    let id = &rec.id;
    // The token has ended: without this the janitor would reap its backend mid-review.
    let _hold = rec.backend.as_deref().map(crate::provider::holds::hold);
    let result = async {
        if rec.backend.is_none() && rec.fork_count > 0 {
            // Its scratch database existed and is gone: "no changes" would be a guess.
            return Err(ReviewError::Backend(
                "its scratch database is gone (the review cannot be taken)".into(),
            ));
        }
        if let Some(handle) = rec.backend.as_deref() {
            let scratch = rv
                .provider
                .ended_backend(handle)
                .await
                .map_err(|e| ReviewError::Backend(e.to_string()))?;
            rv.provider
                .quiesce(&scratch)
                .await
                .map_err(|e| ReviewError::Backend(e.to_string()))?;
            crash_point("review:quiesced");
        }
        let review = take_with(rv, rec, false, true, verify::skipped_at_end(rv)).await?;
        crash_point("review:taken");
        let stmts = statements(rv, rec)?;
        write_all(&rv.dir, &review, &stmts)?;
        crash_point("review:written");
        Ok::<_, ReviewError>(review)
    }
    .await;
    match result {
        Ok(r) => {
            tracing::info!(token = %id, schema_changes = r.schema.len(),
                tables_changed = r.data.len(), ms = r.duration_ms as u64, "review stored");
            Ok(())
        }
        Err(e) => {
            metrics::counter!("sandpit_review_failures_total").increment(1);
            tracing::warn!(token = %id, error = %e, "review at end of token failed");
            Err(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::log::{OutcomeRecord, StatementRecord};

    fn stmt(seq: u64, kind: &str, sqlstate: Option<&str>, done: bool) -> LoggedStatement {
        LoggedStatement {
            statement: StatementRecord {
                seq,
                ts: String::new(),
                token: "t".into(),
                task: "k".into(),
                session: 1,
                protocol: "simple".into(),
                text: "x".repeat(600),
                params: Vec::new(),
                kind: kind.into(),
            },
            cut: None,
            kind_source: None,
            front: None,
            front_seq: None,
            outcome: done.then(|| OutcomeRecord {
                seq,
                ts: String::new(),
                rows: None,
                capped: false,
                duration_ms: 1.0,
                sqlstate: sqlstate.map(str::to_string),
                tag: None,
                skipped: false,
                denied: false,
                kind: None,
            }),
        }
    }

    #[test]
    fn summary_counts_kinds_failures_and_unfinished() {
        let s = summarize(&[
            stmt(1, "read", None, true),
            stmt(2, "write", Some("23505"), true),
            stmt(3, "write", None, false),
        ]);
        assert_eq!(s.total, 3);
        assert_eq!(s.by_kind.get("write"), Some(&2));
        assert_eq!(s.unfinished, 1);
        assert_eq!(s.failed.len(), 1);
        assert_eq!(s.failed[0].sqlstate, "23505");
        assert!(s.failed[0].text.chars().count() <= FAILED_TEXT_MAX + 1);
    }

    #[test]
    fn streamed_summary_matches_the_summary_of_the_loaded_log() {
        use crate::journal::log::{LogRecord, TokenLog};
        let dir = tempfile::tempdir().unwrap();
        let log = TokenLog::open(dir.path(), "k", "t", 0).unwrap();
        let stmts = [
            stmt(1, "read", None, true),
            stmt(2, "write", Some("23505"), true),
            stmt(3, "write", None, false),
            stmt(4, "ddl", Some("42P01"), true),
        ];
        for s in &stmts {
            assert_eq!(log.next_seq(), s.statement.seq);
            log.append(&LogRecord::Statement(s.statement.clone()))
                .unwrap();
        }
        for s in &stmts {
            if let Some(o) = &s.outcome {
                log.append(&LogRecord::Outcome(o.clone())).unwrap();
            }
        }
        let files = log::LogFiles::Single(log.path().to_path_buf());
        assert_eq!(summarize_log(&files).unwrap(), summarize(&stmts));
    }

    #[test]
    fn cap_respects_char_boundaries_and_formats_parse() {
        assert_eq!(cap("héllo", 2), "h…");
        assert_eq!(cap("abc", 5), "abc");
        assert_eq!(Format::parse("html"), Some(Format::Html));
        assert_eq!(Format::parse("yaml"), None);
        assert_eq!(
            crate::review::html::esc("<a href='x'>&"),
            "&lt;a href=&#39;x&#39;&gt;&amp;"
        );
    }
}
