//! Promotion: the reviewed path from a scratch database to a real one. A person (or a
//! stricter validator) decides on each token's review — approve or reject with a comment,
//! kept in an audit trail next to the review — and an approved change is applied to a target
//! database in one transaction, guarded row by row and object by object against the golden
//! it was made from, so a target that moved since gets nothing and a list of conflicts.

pub mod across;
pub mod apply;
pub mod change;
pub mod decisions;
pub mod guards;
pub mod kinds;
pub mod leaks;
pub mod multiset;
pub mod names;
pub mod plan;
pub mod plan_model;
pub mod promotable;
pub mod rebase;
pub mod resolve;
pub mod safety;
mod schema_steps;
pub mod target;
pub mod target_catalog;
pub mod validators;

use std::collections::BTreeSet;

use decisions::{Event, PromoteReport, ReviewRecord, ReviewState};

use crate::lifecycle::Gateway;
use crate::provider::Provider;
use crate::registry::TokenRecord;
use crate::review::reviewer::reviews_dir;

/// Longest comment kept.
pub const COMMENT_MAX: usize = 4000;

/// Why a decision or promotion was not made.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    /// No such token.
    #[error("unknown token {0}")]
    Unknown(String),
    /// The request does not make sense (bad target, empty comment).
    #[error("{0}")]
    Invalid(String),
    /// The review is not in a state that allows it.
    #[error("{0}")]
    State(String),
    /// The caller may not do it.
    #[error("{0}")]
    Forbidden(String),
    /// Reading or writing the record.
    #[error(transparent)]
    Record(#[from] decisions::RecordError),
}

/// Approve or reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Approve.
    Approve,
    /// Reject.
    Reject,
}

/// Who acts: the admin key, or a named reviewer key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// The admin key.
    Admin,
    /// A reviewer key, by its name in the config.
    Reviewer(String),
}

impl Who {
    /// As the audit trail records it.
    pub fn label(&self) -> String {
        match self {
            Who::Admin => "admin".into(),
            Who::Reviewer(n) => format!("reviewer:{n}"),
        }
    }
}

/// The record of `rec` (a fresh one when nothing was written yet).
pub fn record(gw: &Gateway, rec: &TokenRecord) -> Result<ReviewRecord, PromoteError> {
    Ok(
        decisions::load(&reviews_dir(&gw.config), &rec.task, &rec.id)?
            .unwrap_or_else(|| ReviewRecord::new(&rec.id, &rec.task, rec.golden.clone())),
    )
}

/// Called by the lifecycle right before a token's backend is destroyed (after the review is
/// stored): run the golden's validators and capture the change for promotion. Failures are
/// recorded, never block the destroy.
pub async fn on_end(config: &crate::config::Config, provider: &dyn Provider, rec: &TokenRecord) {
    let id = &rec.id;
    let cfg = &config.promote;
    let dir = reviews_dir(config);
    let checks = validators::for_golden(&cfg.validators, rec.golden.as_deref());
    let (results, capture) = match rec.backend.as_deref() {
        None => (Vec::new(), None),
        Some(handle) => match provider.ensure_running(handle).await {
            Err(e) => {
                tracing::warn!(token = %id, error = %e, "promotion capture: backend not reachable");
                let failed = checks
                    .iter()
                    .map(|v| validators::ValidatorResult {
                        name: v.name.clone(),
                        kind: if v.sql.is_some() { "sql" } else { "command" }.into(),
                        passed: false,
                        detail: format!("the scratch database could not be reached: {e}"),
                    })
                    .collect();
                (failed, None)
            }
            Ok(backend) => {
                let scratch = provider.review_target(&backend);
                let results = validators::run(&checks, &scratch).await;
                let capture = if cfg.capture {
                    Some(change::capture(config, provider, rec, &scratch, &dir).await)
                } else {
                    None
                };
                (results, capture)
            }
        },
    };
    let r =
        decisions::update::<_, PromoteError>(&dir, &rec.task, &rec.id, rec.golden.clone(), |r| {
            r.validators = results;
            r.validated_at = Some(decisions::now());
            r.capture = capture;
            Ok(())
        });
    if let Err(e) = r {
        tracing::warn!(token = %id, error = %e, "writing the review record failed");
    }
}

/// Approve or reject the review of `rec`.
pub fn decide(
    gw: &Gateway,
    rec: &TokenRecord,
    d: Decision,
    comment: &str,
    who: &Who,
) -> Result<ReviewRecord, PromoteError> {
    let comment = comment.trim();
    if comment.len() > COMMENT_MAX {
        return Err(PromoteError::Invalid(format!(
            "comment longer than {COMMENT_MAX} bytes"
        )));
    }
    if d == Decision::Reject && comment.is_empty() {
        return Err(PromoteError::Invalid(
            "a rejection needs a comment saying why".into(),
        ));
    }
    if rec.state.is_usable() {
        return Err(PromoteError::State(format!(
            "token {} is still live: end it (revoke) first, so the change reviewed is final",
            rec.id
        )));
    }
    if d == Decision::Approve {
        // What a person would approve is not known: the review failed or is not stored.
        if let Some(why) = crate::registry::end::approval_refused(rec) {
            return Err(PromoteError::State(why));
        }
    }
    let dir = reviews_dir(&gw.config);
    let ((), r) = decisions::update(&dir, &rec.task, &rec.id, rec.golden.clone(), |r| {
        if r.state == ReviewState::Promoted {
            return Err(PromoteError::State(
                "the change was promoted already".into(),
            ));
        }
        if d == Decision::Approve {
            // Known when the token ended: a change that cannot be promoted is not approved.
            if let Some(why) = r.capture.as_ref().filter(|c| !c.refusals.is_empty()) {
                return Err(PromoteError::State(format!(
                    "the change cannot be promoted (approval is blocked): {}",
                    why.refusals.join("; ")
                )));
            }
            let failed = r.failed_validators();
            if !failed.is_empty() {
                let names: Vec<&str> = failed.iter().map(|v| v.name.as_str()).collect();
                return Err(PromoteError::State(format!(
                    "validators failed: {} (approval is blocked)",
                    names.join(", ")
                )));
            }
            let wanted =
                validators::for_golden(&gw.config.promote.validators, rec.golden.as_deref());
            let ran: BTreeSet<&str> = r.validators.iter().map(|v| v.name.as_str()).collect();
            if let Some(v) = wanted.iter().find(|v| !ran.contains(v.name.as_str())) {
                return Err(PromoteError::State(format!(
                    "validator {} has not run against this task (approval is blocked)",
                    v.name
                )));
            }
        }
        let (state, action) = match d {
            Decision::Approve => (ReviewState::Approved, "approved"),
            Decision::Reject => (ReviewState::Rejected, "rejected"),
        };
        r.state = state;
        r.trail.push(Event {
            at: decisions::now(),
            by: who.label(),
            action: action.into(),
            comment: comment.to_string(),
        });
        Ok(())
    })?;
    match d {
        Decision::Approve => metrics::counter!("sandpit_review_approvals_total").increment(1),
        Decision::Reject => metrics::counter!("sandpit_review_rejections_total").increment(1),
    }
    tracing::info!(token = %rec.id, by = %who.label(), state = r.state.words(), "review decided");
    Ok(r)
}

/// At start: every record a killed gateway left with a promotion under way gets its
/// `promote-interrupted` entry.
pub fn recover_interrupted(dir: &std::path::Path) {
    let Ok(tasks) = std::fs::read_dir(dir) else {
        return;
    };
    for task in tasks.flatten().filter(|e| e.path().is_dir()) {
        let Ok(files) = std::fs::read_dir(task.path()) else {
            continue;
        };
        let task_name = task.file_name().to_string_lossy().to_string();
        for f in files.flatten() {
            let name = f.file_name().to_string_lossy().to_string();
            let Some(token) = name.strip_suffix(".promote.json") else {
                continue;
            };
            let Ok(Some(r)) = decisions::load(dir, &task_name, token) else {
                continue;
            };
            if r.promoting.is_none() {
                continue;
            }
            // Another front sharing the directory may be promoting it now: not interrupted.
            let Ok(Some(_held)) = across::try_lock(dir, &task_name, token, across::Kind::Promotion)
            else {
                continue;
            };
            let golden = r.golden.clone();
            let done = decisions::update::<_, PromoteError>(dir, &task_name, token, golden, |r| {
                Ok(r.settle_interrupted())
            });
            match done {
                Ok(_) => tracing::warn!(token, "a promotion was interrupted by a gateway stop"),
                Err(e) => {
                    tracing::warn!(token, error = %e, "recording an interrupted promotion failed")
                }
            }
        }
    }
}

/// Where to promote to: a DSN, a target named in the config, or (neither) the default —
/// see [`resolve`].
#[derive(Debug, Clone, Default)]
pub struct PromoteRequest {
    /// A DSN (admin only).
    pub dsn: Option<String>,
    /// A target named under `[promote.targets]`.
    pub target: Option<String>,
    /// Role to apply the change as (default the named target's, else the login role).
    pub role: Option<String>,
    /// Report only.
    pub dry_run: bool,
}

/// Serialises promotions in this process (one change applied at a time).
static PROMOTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Promote the approved change of `rec` (or, with `dry_run`, report what would happen).
pub async fn promote(
    gw: &Gateway,
    rec: &TokenRecord,
    req: &PromoteRequest,
    who: &Who,
) -> Result<(PromoteReport, ReviewRecord), PromoteError> {
    let cfg = &gw.config.promote;
    let kept = record(gw, rec)?.capture.and_then(|c| c.source_conninfo);
    let resolve::Resolved {
        target,
        shown,
        role,
        ..
    } = resolve::resolve(
        cfg,
        gw.provider.as_ref(),
        rec.golden.as_deref(),
        kept.as_deref(),
        req,
        who,
    )
    .await?;
    if let Who::Reviewer(_) = who {
        if !cfg.reviewers_may_promote {
            return Err(PromoteError::Forbidden(
                "reviewer keys may not promote (promote.reviewers_may_promote = false)".into(),
            ));
        }
    }
    let _one = PROMOTING.lock().await;
    let dir = reviews_dir(&gw.config);
    // One promotion of a token at a time across fronts too; waited for off the async
    // threads (another front's promotion may take a while).
    let _across = {
        let (d, task, id) = (dir.clone(), rec.task.clone(), rec.id.clone());
        tokio::task::spawn_blocking(move || across::lock(&d, &task, &id, across::Kind::Promotion))
            .await
            .map_err(|e| PromoteError::State(format!("promotion lock: {e}")))?
            .map_err(|source| decisions::RecordError::Io {
                path: dir.clone(),
                source,
            })?
    };
    let current = record(gw, rec)?;
    if !req.dry_run && current.state != ReviewState::Approved {
        return Err(PromoteError::State(format!(
            "the review is {}: only an approved change is promoted",
            current.state.words()
        )));
    }
    // Marked under way first: a gateway killed from here on leaves an "interrupted" entry.
    let started = Event {
        at: decisions::now(),
        by: who.label(),
        action: "promote-started".into(),
        comment: shown.clone(),
    };
    decisions::update::<_, PromoteError>(&dir, &rec.task, &rec.id, rec.golden.clone(), |r| {
        r.settle_interrupted();
        r.promoting = Some(started);
        Ok(())
    })?;
    let mut report = PromoteReport {
        outcome: String::new(),
        target: shown,
        role: role.clone(),
        dry_run: req.dry_run,
        at: decisions::now(),
        by: who.label(),
        counts: Default::default(),
        conflicts: Vec::new(),
        conflicts_total: 0,
        refusals: Vec::new(),
        error: None,
    };
    match change::load(&dir, &rec.task, &rec.id) {
        None => {
            report.outcome = "refused".into();
            report.refusals.push(
                "no change was captured when the token ended (promote.capture off, or the token never connected)".into(),
            );
        }
        Some(ch) => {
            let masked: plan::Masked = ch.masked.iter().cloned().collect();
            let mut p = plan::build(&ch.review, &masked);
            p.column_guards = ch.dropped_columns.clone();
            p.multiset_guards = ch.multiset_guards.clone();
            report.counts = p.counts();
            if let Some(reason) = current.capture.as_ref().and_then(|c| c.reason.clone()) {
                report
                    .refusals
                    .push(format!("the captured change is incomplete: {reason}"));
            }
            report.refusals.extend(p.refusals.iter().cloned());
            for r in &ch.refusals {
                if !report.refusals.contains(r) {
                    report.refusals.push(r.clone());
                }
            }
            if !report.refusals.is_empty() {
                report.outcome = "refused".into();
            } else {
                match apply::apply(
                    &p,
                    &target,
                    role.as_deref(),
                    req.dry_run,
                    cfg.statement_timeout,
                )
                .await
                {
                    Ok(apply::Applied::Done) => {
                        report.outcome = if req.dry_run { "dry_run" } else { "applied" }.into()
                    }
                    Ok(apply::Applied::Conflicts(c, total)) => {
                        report.outcome = "conflicts".into();
                        report.conflicts = c;
                        report.conflicts_total = total;
                    }
                    Err(e) => {
                        report.outcome = "failed".into();
                        report.error = Some(e.to_string());
                    }
                }
            }
        }
    }
    metrics::counter!("sandpit_promotions_total", "outcome" => report.outcome.clone()).increment(1);
    if report.conflicts_total > 0 {
        metrics::counter!("sandpit_promote_conflicts_total")
            .increment(report.conflicts_total as u64);
    }
    let summary =
        match report.outcome.as_str() {
            "applied" | "dry_run" => format!(
            "{} to {}: {} schema changes, {} inserted, {} updated, {} deleted rows, {} sequences",
            if req.dry_run { "would apply" } else { "applied" },
            report.target,
            report.counts.schema,
            report.counts.inserted,
            report.counts.updated,
            report.counts.deleted,
            report.counts.sequences
        ),
            "conflicts" => format!(
                "{} conflicts in {}; nothing applied",
                report.conflicts_total, report.target
            ),
            "refused" => format!("refused: {}", report.refusals.join("; ")),
            _ => format!(
                "failed on {}: {}; nothing applied",
                report.target,
                report.error.clone().unwrap_or_default()
            ),
        };
    let action = match (report.outcome.as_str(), req.dry_run) {
        ("applied", _) => "promoted".to_string(),
        (o, true) => format!("promote-dry-run-{o}"),
        (o, false) => format!("promote-{o}"),
    };
    let stored = report.clone();
    let ((), r) =
        decisions::update::<_, PromoteError>(&dir, &rec.task, &rec.id, rec.golden.clone(), |r| {
            r.promoting = None;
            if stored.outcome == "applied" {
                r.state = ReviewState::Promoted;
            }
            r.trail.push(Event {
                at: stored.at.clone(),
                by: stored.by.clone(),
                action,
                comment: summary,
            });
            r.promotions.push(stored);
            Ok(())
        })?;
    tracing::info!(token = %rec.id, outcome = %report.outcome, target = %report.target, "promotion");
    Ok((report, r))
}
