//! The patch replay check: the review's SQL patch is applied to a fresh fork of the golden,
//! in one transaction, as that fork's own owner role (a non-superuser with exactly the
//! privileges the agent had, in a database the agent never reached), and the result is
//! compared with the scratch database — every schema object, every table's content hash and
//! every sequence's position (see [`dump`]). The fork is destroyed afterwards. The review
//! then says "patch verified: exact", "patch verified: differs at …", or "patch not
//! verified: <reason>"; never nothing.

pub mod dump;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::conn::{ConnError, Side, Timeouts};
use super::model::{Compared, Verification, VerifyStatus};
use super::reviewer::Reviewer;
use super::touched;
use crate::pgconn::BackendTarget;
use crate::provider::{Backend, BackendTag};
use crate::registry::TokenRecord;

/// Differences kept in a review (the total is always given).
const DIFFERENCES_MAX: usize = 200;
/// Differences named in the one-line summary.
const SUMMARY_NAMES: usize = 5;
/// How long a verification fork's tag says it may live (the janitor removes one left by a
/// crashed gateway; while a check runs, [`crate::provider::holds::in_flight`] keeps it off the janitor's list).
const FORK_TTL: time::Duration = time::Duration::hours(1);

/// The patch did not apply: the check ends there.
fn failed_to_apply(error: String) -> Verification {
    Verification {
        status: VerifyStatus::Differs,
        summary: format!("patch verified: differs — the patch does not apply: {error}"),
        reason: Some(format!("the patch does not apply: {error}")),
        differences: Vec::new(),
        differences_total: 0,
        compared: Compared::default(),
        duration_ms: 0.0,
    }
}

/// What comparing the scratch database with the patched fork found.
fn compared(scratch: &dump::Dump, patched: &dump::Dump) -> Verification {
    let all = dump::differences(scratch, patched);
    let compared = Compared {
        objects: scratch.objects.len(),
        tables: scratch.tables.len() + scratch.unchanged,
        tables_unchanged: scratch.unchanged,
        sequences: scratch.sequences.len(),
    };
    if all.is_empty() {
        return Verification {
            status: VerifyStatus::Exact,
            summary: "patch verified: exact".into(),
            reason: None,
            differences: Vec::new(),
            differences_total: 0,
            compared,
            duration_ms: 0.0,
        };
    }
    let names: Vec<&str> = all
        .iter()
        .take(SUMMARY_NAMES)
        .map(|d| d.split(": ").next().unwrap_or(d))
        .collect();
    let more = if all.len() > SUMMARY_NAMES {
        format!(" and {} more", all.len() - SUMMARY_NAMES)
    } else {
        String::new()
    };
    Verification {
        status: VerifyStatus::Differs,
        summary: format!("patch verified: differs at {}{more}", names.join(", ")),
        reason: None,
        differences_total: all.len(),
        differences: all.into_iter().take(DIFFERENCES_MAX).collect(),
        compared,
        duration_ms: 0.0,
    }
}

/// Why the end-of-token review of this gateway makes no check, or None when it does.
pub fn skipped_at_end(rv: &Reviewer) -> Option<String> {
    if !rv.settings.verify_on_end {
        Some("review.verify_on_end is off".into())
    } else if !rv.provider.verify_forks_by_default() {
        Some(format!(
            "the {} provider makes no extra fork unless asked (verify=true)",
            rv.provider.name()
        ))
    } else {
        None
    }
}

/// Check `patch` (the review of `rec`, whose scratch database is `scratch`). Never fails:
/// whatever stops the check is its "not verified" reason.
pub async fn check(
    rv: &Reviewer,
    rec: &TokenRecord,
    scratch: &Backend,
    patch: &str,
) -> Verification {
    let started = Instant::now();
    let mut v = check_inner(rv, rec, scratch, patch).await;
    v.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let result = match v.status {
        VerifyStatus::Exact => "exact",
        VerifyStatus::Differs => "differs",
        VerifyStatus::NotVerified => "not_verified",
    };
    metrics::counter!("sandpit_review_verifications_total", "result" => result).increment(1);
    tracing::info!(token = %rec.id, result, ms = v.duration_ms as u64, summary = %v.summary, "patch check");
    v
}

async fn check_inner(
    rv: &Reviewer,
    rec: &TokenRecord,
    scratch: &Backend,
    patch: &str,
) -> Verification {
    let min_free = rv.min_free_bytes;
    if min_free > 0 {
        if let Some(free) = crate::datadir::free_bytes(&rv.data_dir) {
            if free < min_free {
                return Verification::not_verified(format!(
                    "no fork made: the data dir has {free} bytes free, below limits.min_free_bytes"
                ));
            }
        }
    }
    let tag = BackendTag {
        token_id: crate::auth::new_token_id(),
        task: rec.task.clone(),
        expires_at: (time::OffsetDateTime::now_utc() + FORK_TTL)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        gateway_id: rv.gateway_id.clone(),
        // The version the scratch database was copied from, as it says itself.
        golden: scratch.golden.clone().or_else(|| rec.golden.clone()),
    };
    let _by_tag = crate::provider::holds::hold(&tag.token_id);
    let fork = match rv.provider.fork(&tag).await {
        Ok(b) => b,
        Err(e) => {
            return Verification::not_verified(format!("a fresh fork of the golden failed: {e}"));
        }
    };
    let _by_handle = crate::provider::holds::hold(&fork.handle);
    if let (Some(want), Some(got)) = (&tag.golden, &fork.golden) {
        if want != got {
            // The provider fell back to another version (the scratch's is gone): comparing
            // would blame the patch for the golden's differences.
            if let Err(e) = rv.provider.destroy(&fork.handle).await {
                tracing::warn!(handle = %fork.handle, error = %e, "destroying a verification fork failed; the janitor will");
            }
            return Verification::not_verified(format!(
                "the fresh fork is of golden {got}, the scratch database of {want}"
            ));
        }
    }
    let limit = rv.settings.statement_timeout.saturating_mul(3) + Duration::from_secs(60);
    // The pristine fork the counters are compared with (none: every table is hashed).
    // A superuser agent could have forged the scratch side's evidence.
    let reference = match rv.provider.reference(tag.golden.as_deref()).await {
        Ok(_) if rec.superuser => None,
        Ok(r) => Some(r.target),
        Err(e) => {
            tracing::info!(error = %e, "patch check without a reference: every table is hashed");
            None
        }
    };
    let run = apply_and_compare(rv, scratch, &fork, reference.as_ref(), patch);
    let v = match tokio::time::timeout(limit, run).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => Verification::not_verified(e.to_string()),
        Err(_) => Verification::not_verified(format!("the check took longer than {limit:?}")),
    };
    if let Err(e) = rv.provider.destroy(&fork.handle).await {
        tracing::warn!(handle = %fork.handle, error = %e, "destroying a verification fork failed; the janitor will");
    }
    v
}

async fn apply_and_compare(
    rv: &Reviewer,
    scratch: &Backend,
    fork: &Backend,
    reference: Option<&BackendTarget>,
    patch: &str,
) -> Result<Verification, ConnError> {
    let t = Timeouts {
        statement: rv.settings.statement_timeout,
        lock: Duration::from_secs(5),
    };
    // The fork's own owner login: no more privilege than the agent had (the patch carries
    // the agent's functions and values, and the golden's triggers fire), in a database the
    // agent never reached. The patch qualifies every name and the golden's own code expects
    // the database's usual search path, so that path is restored for the apply.
    let owner = rv.provider.session_target(fork, None);
    let apply = Side::connect("verification fork", &owner, t).await?;
    apply
        .exec("SET default_transaction_read_only = off; RESET search_path; RESET row_security")
        .await?;
    if let Err(e) = apply.exec(patch).await {
        let _ = apply.exec("ROLLBACK").await;
        return Ok(failed_to_apply(match e {
            ConnError::Query { message, .. } => message,
            other => other.to_string(),
        }));
    }
    drop(apply);
    let scratch_owner = rv.provider.session_target(scratch, None).user;
    let a = Side::connect("scratch", &rv.provider.review_target(scratch), t).await?;
    let b = Side::connect("verification fork", &rv.provider.review_target(fork), t).await?;
    // The apply session publishes its counters as it leaves; the scratch database's
    // sessions have ended before the review.
    let settle = rv.settings.settle_timeout;
    let (sa, sb) = tokio::join!(settle_side(&a, settle), settle_side(&b, settle));
    let skip = skippable(fork, reference, t, &a, &b, sa? && sb?).await;
    let (da, db) = tokio::join!(
        dump::take(&a, &scratch_owner, &skip),
        dump::take(&b, &owner.user, &skip)
    );
    let _ = a.rollback().await;
    let _ = b.rollback().await;
    Ok(compared(&da?, &db?))
}

/// Opens `side`'s snapshot once its other sessions have published their counters; whether
/// they did in time.
async fn settle_side(side: &Side, timeout: Duration) -> Result<bool, ConnError> {
    touched::settle(side, timeout).await
}

/// The tables not to hash: under each name the same relation on both sides, shown
/// unchanged since the golden on both ([`touched::unchanged_in_both`]; empty when any
/// evidence is missing). Every other table is hashed on both sides.
async fn skippable(
    fork: &Backend,
    reference: Option<&BackendTarget>,
    t: Timeouts,
    a: &Side,
    b: &Side,
    settled: bool,
) -> BTreeSet<String> {
    if !settled {
        tracing::info!("patch check hashes every table: a session did not end in time");
        return BTreeSet::new();
    }
    let Some(reference) = reference else {
        return BTreeSet::new();
    };
    let Ok(r) = Side::connect("reference", reference, t).await else {
        return BTreeSet::new();
    };
    if r.begin().await.is_err() {
        return BTreeSet::new();
    }
    let (ma, mb, mr) = tokio::join!(touched::read(a), touched::read(b), touched::read(&r));
    let _ = r.rollback().await;
    let (Ok(ma), Ok(mb), Ok(mr)) = (ma, mb, mr) else {
        return BTreeSet::new();
    };
    if let Some(why) = touched::why_all(&mr, &ma).or_else(|| touched::why_all(&mr, &mb)) {
        tracing::info!(handle = %fork.handle, reason = %why, "patch check hashes every table");
    }
    touched::unchanged_in_both(&mr, &ma, &mb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_say_exact_differs_or_why_not() {
        let a = dump::Dump::default();
        let v = compared(&a, &a);
        assert_eq!(v.summary, "patch verified: exact");
        let mut b = dump::Dump::default();
        for i in 0..7 {
            b.sequences
                .insert(format!("public.s{i}"), "1 called=true".into());
        }
        let v = compared(&a, &b);
        assert_eq!(v.status, VerifyStatus::Differs);
        assert_eq!(
            v.summary,
            "patch verified: differs at position of sequence public.s0, position of sequence public.s1, \
             position of sequence public.s2, position of sequence public.s3, \
             position of sequence public.s4 and 2 more"
        );
        assert_eq!(v.differences_total, 7);
        let v = Verification::not_verified("not asked for");
        assert_eq!(v.summary, "patch not verified: not asked for");
        assert!(crate::review::render::verification(Some(&v))
            .starts_with("patch not verified: not asked for"));
        let v = failed_to_apply("relation \"x\" does not exist".into());
        assert!(v
            .summary
            .starts_with("patch verified: differs — the patch does not apply"));
        let json = serde_json::to_string(&v).expect("json");
        assert!(json.contains("\"status\":\"differs\""), "{json}");
    }
}
