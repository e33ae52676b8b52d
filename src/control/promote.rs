//! Review decisions and promotion over the API: `GET /v1/reviews`,
//! `GET /v1/tokens/{id}/review`, `POST /v1/tokens/{id}/approve|reject` (`{"comment"}`),
//! `POST /v1/tokens/{id}/promote` (`{"dsn"|"target", "role", "dry_run"}`). The admin key, or
//! a reviewer key of `[promote.reviewer_keys]` (review rights only), as the bearer. Routes
//! are listed in the router (`control/mod.rs`).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use super::{error, ApiState};
use crate::promote::{self, decisions::ReviewRecord, Decision, PromoteError, PromoteRequest, Who};
use crate::registry::TokenRecord;
use crate::review::model::Review;
use crate::review::model::VerifyStatus;
use crate::review::reviewer::reviews_dir;
use crate::review::store::{self, Format};

/// Who a key is: the admin, a reviewer, or nobody.
pub(crate) fn who_is(s: &ApiState, given: &str) -> Option<Who> {
    if given.is_empty() {
        return None;
    }
    if bool::from(given.as_bytes().ct_eq(s.admin_key.as_bytes())) {
        return Some(Who::Admin);
    }
    // Every key is compared (no early exit on a match) so timing says nothing of which.
    let mut found = None;
    for (name, key) in &s.gw.config.promote.reviewer_keys {
        if bool::from(given.as_bytes().ct_eq(key.as_bytes())) && !key.is_empty() {
            found = Some(Who::Reviewer(name.clone()));
        }
    }
    found
}

// The error is the response itself, built once per refused request.
#[allow(clippy::result_large_err)]
fn auth(s: &ApiState, headers: &HeaderMap) -> Result<Who, Response> {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    who_is(s, given).ok_or_else(|| {
        metrics::counter!("sandpit_api_auth_failures_total").increment(1);
        error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong key (Authorization: Bearer <admin or reviewer key>)",
        )
    })
}

pub(crate) fn promote_error_status(e: &PromoteError) -> StatusCode {
    match e {
        PromoteError::Unknown(_) => StatusCode::NOT_FOUND,
        PromoteError::Invalid(_) => StatusCode::BAD_REQUEST,
        PromoteError::State(_) => StatusCode::CONFLICT,
        PromoteError::Forbidden(_) => StatusCode::FORBIDDEN,
        PromoteError::Record(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub(crate) fn promote_error(e: PromoteError) -> Response {
    error(promote_error_status(&e), e.to_string())
}

/// One line of the review list.
#[derive(Debug, Serialize)]
pub struct ReviewSummary {
    /// Token id.
    pub token: String,
    /// Task.
    pub task: String,
    /// Token state (issued, live, expired, revoked).
    pub token_state: String,
    /// Golden version.
    pub golden: Option<String>,
    /// needs_review, approved, rejected, promoted (live tokens: needs_review).
    pub state: promote::decisions::ReviewState,
    /// Schema changes and changed rows, when captured.
    pub schema_changes: Option<usize>,
    /// Changed rows, when captured.
    pub rows_changed: Option<u64>,
    /// Validators that failed.
    pub validators_failed: usize,
    /// The last decision or promotion, for the list.
    pub last: Option<promote::decisions::Event>,
    /// The end-of-token review: `stored`, `pending` or `failed: <reason>` (absent while the
    /// token is usable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub review: Option<String>,
}

pub(crate) fn summaries(s: &ApiState, records: &[TokenRecord]) -> Vec<ReviewSummary> {
    records
        .iter()
        .map(|t| {
            let r = promote::record(&s.gw, t).unwrap_or_default();
            ReviewSummary {
                token: t.id.clone(),
                task: t.task.clone(),
                token_state: t.state.as_str().to_string(),
                golden: t.golden.clone(),
                state: r.state,
                schema_changes: r.capture.as_ref().map(|c| c.schema_changes),
                rows_changed: r.capture.as_ref().map(|c| c.rows),
                validators_failed: r.failed_validators().len(),
                last: r.trail.last().cloned(),
                review: crate::registry::end::review_status(t),
            }
        })
        .collect()
}

pub(crate) async fn list(State(s): State<ApiState>, headers: HeaderMap) -> Response {
    if let Err(r) = auth(&s, &headers) {
        return r;
    }
    let mut records = match s.gw.registry.list_fresh().await {
        Ok(r) => r,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    records.sort_by_key(|r| std::cmp::Reverse(r.created_at));
    Json(summaries(&s, &records)).into_response()
}

#[allow(clippy::result_large_err)]
pub(crate) fn token(s: &ApiState, id: &str) -> Result<TokenRecord, Response> {
    s.gw.registry
        .get(id)
        .ok_or_else(|| promote_error(PromoteError::Unknown(id.to_string())))
}

pub(crate) async fn show(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = auth(&s, &headers) {
        return r;
    }
    let rec = match token(&s, &id) {
        Ok(r) => r,
        Err(r) => return r,
    };
    match promote::record(&s.gw, &rec) {
        Ok(r) => Json::<ReviewRecord>(r).into_response(),
        Err(e) => promote_error(e),
    }
}

/// Body of approve and reject.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// Why.
    #[serde(default)]
    pub comment: String,
}

async fn decide(
    s: ApiState,
    headers: HeaderMap,
    id: String,
    body: Result<Json<DecisionBody>, axum::extract::rejection::JsonRejection>,
    d: Decision,
) -> Response {
    let who = match auth(&s, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let Json(b) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let rec = match token(&s, &id) {
        Ok(r) => r,
        Err(r) => return r,
    };
    match decide_once(&s, &rec, d, &b.comment, &who) {
        Ok(r) => Json(r).into_response(),
        Err(e) => promote_error(e),
    }
}

pub(crate) async fn approve(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<DecisionBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    decide(s, headers, id, body, Decision::Approve).await
}

pub(crate) async fn reject(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<DecisionBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    decide(s, headers, id, body, Decision::Reject).await
}

/// Body of `POST /v1/tokens/{id}/promote`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PromoteBody {
    /// Target DSN (admin key only); never logged or echoed.
    pub dsn: Option<String>,
    /// A target named under `[promote.targets]` (default: "default").
    pub target: Option<String>,
    /// Role to apply the change as.
    pub role: Option<String>,
    /// Report only.
    #[serde(default)]
    pub dry_run: bool,
}

pub(crate) async fn promote_token(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Result<Json<PromoteBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let who = match auth(&s, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let Json(b) = match body {
        Ok(b) => b,
        // The rejection may quote the body (a DSN): only its kind.
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "body must be JSON {{\"dsn\"|\"target\", \"role\", \"dry_run\"}} ({})",
                    e.status()
                ),
            )
        }
    };
    let rec = match token(&s, &id) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let req = PromoteRequest {
        dsn: b.dsn,
        target: b.target,
        role: b.role,
        dry_run: b.dry_run,
    };
    match promote::promote(&s.gw, &rec, &req, &who).await {
        Ok((report, _)) => Json(report).into_response(),
        Err(e) => promote_error(e),
    }
}

/// The token's stored review (its JSON form), when one was written and parses.
pub(crate) fn stored_review(s: &ApiState, rec: &TokenRecord) -> Option<Review> {
    let text = store::load(&reviews_dir(&s.gw.config), &rec.task, &rec.id, Format::Json)?;
    serde_json::from_str(&text).ok()
}

/// Why the stored review's patch check blocks approval: "patch verified: differs" means the
/// scratch database holds something the review does not model (row security, rules,
/// storage options, …), so what a person approves would not be the change the agent made.
pub(crate) fn unmodelled(stored: Option<&Review>) -> Option<String> {
    let v = stored?.verification.as_ref()?;
    (v.status == VerifyStatus::Differs).then(|| {
        format!(
            "{}: the scratch database holds changes the review does not model; approval is blocked",
            v.summary
        )
    })
}

/// Every reason approval of `rec` is refused today, for a person (the page shows them beside
/// Approve): the review missing or failed, the patch check differing, the change found
/// unpromotable when the token ended, validators failed or not run.
pub(crate) fn approval_blockers(
    s: &ApiState,
    rec: &TokenRecord,
    r: &ReviewRecord,
    stored: Option<&Review>,
) -> Vec<String> {
    let mut out: Vec<String> = crate::registry::end::approval_refused(rec)
        .into_iter()
        .collect();
    let differs = stored
        .and_then(|x| x.verification.as_ref())
        .filter(|v| v.status == VerifyStatus::Differs)
        .map(|v| v.summary.clone());
    if let Some(why) = unmodelled(stored) {
        out.push(why);
    }
    if let Some(c) = &r.capture {
        // The capture's own copy of the patch-check refusal is named once.
        let same = |x: &String| differs.as_ref().is_some_and(|d| x.starts_with(d.as_str()));
        out.extend(c.refusals.iter().filter(|x| !same(x)).cloned());
    }
    for v in r.failed_validators() {
        out.push(format!("validator {} failed", v.name));
    }
    let wanted =
        promote::validators::for_golden(&s.gw.config.promote.validators, rec.golden.as_deref());
    for v in wanted {
        if !r.validators.iter().any(|x| x.name == v.name) {
            out.push(format!(
                "validator {} has not run against this task",
                v.name
            ));
        }
    }
    out
}

/// Serialises decisions in this process, so "not decided yet" is still true when one is
/// recorded.
static DECIDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`promote::decide`], once: a review already approved, rejected or promoted is refused
/// (decisions are final, so what was approved is what the trail says), and approval is
/// refused while the patch check says the review does not model the whole change.
pub(crate) fn decide_once(
    s: &ApiState,
    rec: &TokenRecord,
    d: Decision,
    comment: &str,
    who: &Who,
) -> Result<ReviewRecord, PromoteError> {
    let _one = DECIDING.lock().unwrap_or_else(|p| p.into_inner());
    let r = promote::record(&s.gw, rec)?;
    if r.state != promote::decisions::ReviewState::NeedsReview {
        let by = r
            .trail
            .iter()
            .rev()
            .find(|e| e.action == "approved" || e.action == "rejected")
            .map(|e| format!(" by {} at {}", e.by, e.at))
            .unwrap_or_default();
        return Err(PromoteError::State(format!(
            "the change was {}{by} already: decisions are final",
            r.state.words()
        )));
    }
    if d == Decision::Approve && !rec.state.is_usable() {
        let already = r.capture.as_ref().is_some_and(|c| !c.refusals.is_empty());
        if let Some(why) = unmodelled(stored_review(s, rec).as_ref()).filter(|_| !already) {
            return Err(PromoteError::State(why));
        }
    }
    promote::decide(&s.gw, rec, d, comment, who)
}
