//! The HTTP control API for the harness (bearer admin key, checked by one middleware for
//! every `/v1` route): issue, list, show, revoke tokens; `/metrics` (Prometheus text),
//! `/healthz` and `/mcp` (its own router and bearer) without the admin key.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::lifecycle::{janitor, EndReason, Gateway, IssueRequest, LifecycleError};
use crate::mcp::http::McpState;
use crate::registry::RegistryError;

mod goldens;
mod metrics_help;
mod promote;
mod review_page;

pub use metrics_help::{describe_metrics, MetricKind, METRICS};

/// State of the API server.
#[derive(Clone)]
pub struct ApiState {
    /// The gateway.
    pub gw: Arc<Gateway>,
    /// Bearer key that every /v1 call must carry.
    pub admin_key: Arc<String>,
    /// Renders `/metrics`; None when no recorder is installed (tests).
    pub metrics: Option<PrometheusHandle>,
}

/// Body of `POST /v1/tokens`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueBody {
    /// Task name.
    pub task: String,
    /// TTL in seconds.
    pub ttl_seconds: Option<u64>,
    /// Row cap.
    pub max_rows: Option<u64>,
    /// Byte cap.
    pub max_bytes: Option<u64>,
    /// Session cap.
    pub max_connections: Option<u32>,
    /// "truncate" (default) or "error".
    pub cap_mode: Option<crate::registry::CapMode>,
    /// Seatbelt policy: allowed statement kinds.
    pub allow: Option<Vec<String>>,
    /// Statement timeout in ms (0 = none).
    pub statement_timeout_ms: Option<u64>,
    /// Idle-in-transaction timeout in ms (0 = none).
    pub idle_in_transaction_timeout_ms: Option<u64>,
    /// Metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Log in as a superuser of the token's own VM (microvm provider only).
    #[serde(default)]
    pub superuser: bool,
}

/// The router.
pub fn router(state: ApiState) -> Router {
    let admin = Router::new()
        .route("/v1/tokens", get(list_tokens).post(issue_token))
        .route("/v1/tokens/{id}", get(show_token).delete(revoke_token))
        .route("/v1/tokens/{id}/discard", post(discard_token))
        .route("/v1/reap", post(reap))
        .route("/v1/goldens", get(goldens::list).post(goldens::build))
        .route("/v1/goldens/{id}/use", post(goldens::use_version))
        .route("/v1/tokens/{id}/statements", get(token_statements))
        .route("/v1/tokens/{id}/diff", get(token_diff))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_admin_key,
        ));
    Router::new()
        .merge(admin)
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        // Review and promotion routes check their own keys: admin or a reviewer key.
        .route("/v1/reviews", get(promote::list))
        .route("/v1/tokens/{id}/review", get(promote::show))
        .route("/v1/tokens/{id}/approve", post(promote::approve))
        .route("/v1/tokens/{id}/reject", post(promote::reject))
        .route("/v1/tokens/{id}/promote", post(promote::promote_token))
        .route("/review", get(review_page::list))
        .route("/review/login", post(review_page::login))
        .route("/review/logout", post(review_page::logout))
        .route("/review/{id}", get(review_page::token))
        .route("/review/{id}/decide", post(review_page::decide))
        .route("/review/{id}/promote", post(review_page::promote))
        .with_state(state.clone())
        .merge(crate::mcp::http::router(McpState { gw: state.gw }))
        .layer(middleware::from_fn(to_completion))
}

/// Runs every request's handler on a task of its own, to its end. The HTTP server drops a
/// handler when its client goes away (a harness's HTTP timeout), and a revoke, promote or
/// decision cut there would stop between two of its steps: a revoked token would then wait
/// for the janitor for its review and its backend's destroy.
async fn to_completion(req: Request, next: Next) -> Response {
    match tokio::spawn(next.run(req)).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "an API request's handler failed");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request failed inside the gateway (see its log)",
            )
        }
    }
}

pub(crate) fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

// The error is the response itself, built once per refused request.
#[allow(clippy::result_large_err)]
pub(crate) fn check_auth(state: &ApiState, headers: &HeaderMap) -> Result<(), Response> {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(state.admin_key.as_bytes())) && !given.is_empty() {
        Ok(())
    } else {
        metrics::counter!("sandpit_api_auth_failures_total").increment(1);
        Err(error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong admin key (Authorization: Bearer <key>)",
        ))
    }
}

/// Middleware of the `/v1` routes: nothing runs, not even the parsing of the request, before
/// the admin key is checked.
async fn require_admin_key(State(s): State<ApiState>, req: Request, next: Next) -> Response {
    match check_auth(&s, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refused) => refused,
    }
}

fn lifecycle_error(e: LifecycleError) -> Response {
    match e {
        LifecycleError::Unknown(id) => error(StatusCode::NOT_FOUND, format!("unknown token {id}")),
        LifecycleError::Invalid(m) => error(StatusCode::BAD_REQUEST, m),
        LifecycleError::End(e) => error(StatusCode::CONFLICT, e.to_string()),
        LifecycleError::Registry(e @ RegistryError::Busy { .. }) => {
            tracing::warn!(error = %e, "api request refused");
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
            r
        }
        other => {
            tracing::error!(error = %other, "api request failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
        }
    }
}

async fn issue_token(
    State(s): State<ApiState>,
    body: Result<Json<IssueBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(b) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let req = IssueRequest {
        task: b.task,
        ttl: b.ttl_seconds.map(Duration::from_secs),
        max_rows: b.max_rows,
        max_bytes: b.max_bytes,
        max_connections: b.max_connections,
        cap_mode: b.cap_mode,
        allow: b.allow,
        statement_timeout: b.statement_timeout_ms.map(Duration::from_millis),
        idle_in_transaction_timeout: b.idle_in_transaction_timeout_ms.map(Duration::from_millis),
        metadata: b.metadata,
        superuser: b.superuser,
    };
    match s.gw.issue(req).await {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => lifecycle_error(e),
    }
}

async fn list_tokens(State(s): State<ApiState>) -> Response {
    // Read afresh: with a shared registry, tokens of every replica.
    let records = match s.gw.registry.list_fresh().await {
        Ok(r) => r,
        Err(e) => return lifecycle_error(e.into()),
    };
    let views: Vec<_> = records.iter().map(|r| s.gw.view(r)).collect();
    Json(views).into_response()
}

async fn show_token(State(s): State<ApiState>, Path(id): Path<String>) -> Response {
    match s.gw.registry.fresh(&id).await {
        Ok(Some(r)) => Json(s.gw.view(&r)).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("unknown token {id}")),
        Err(e) => lifecycle_error(e.into()),
    }
}

/// An ended token whose review could not be stored: its scratch data destroyed without one.
async fn discard_token(State(s): State<ApiState>, Path(id): Path<String>) -> Response {
    match s.gw.discard(&id).await {
        Ok(r) => Json(s.gw.view(&r)).into_response(),
        Err(e) => lifecycle_error(e),
    }
}

async fn revoke_token(State(s): State<ApiState>, Path(id): Path<String>) -> Response {
    match s.gw.end(&id, EndReason::Revoked).await {
        Ok(_) => match s.gw.registry.get(&id) {
            Some(r) => Json(s.gw.view(&r)).into_response(),
            None => error(StatusCode::NOT_FOUND, format!("unknown token {id}")),
        },
        Err(e) => lifecycle_error(e),
    }
}

/// Query of `POST /v1/reap`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReapQuery {
    /// Only report what a pass would do.
    #[serde(default)]
    pub dry_run: bool,
}

async fn reap(
    State(s): State<ApiState>,
    q: Result<Query<ReapQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    match janitor::run_pass(&s.gw, q.dry_run).await {
        Ok(report) => Json(report).into_response(),
        Err(e) => lifecycle_error(e),
    }
}

async fn metrics_text(State(s): State<ApiState>) -> Response {
    match &s.metrics {
        Some(h) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4",
            )],
            {
                // Counted at render time, so the gauge is never stale.
                janitor::refresh_gauges(&s.gw);
                h.render()
            },
        )
            .into_response(),
        None => error(StatusCode::NOT_FOUND, "metrics recorder not installed"),
    }
}

/// Query of `GET /v1/tokens/{id}/statements`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatementsQuery {
    /// Statements with a greater `seq` (0 = from the start).
    #[serde(default)]
    pub after: u64,
    /// Statements per page (default [`STATEMENTS_PAGE`], at most [`STATEMENTS_PAGE_MAX`]).
    pub limit: Option<usize>,
}

/// Default page size of `GET /v1/tokens/{id}/statements`.
pub const STATEMENTS_PAGE: usize = 1000;
/// Largest page size of `GET /v1/tokens/{id}/statements`.
pub const STATEMENTS_PAGE_MAX: usize = 10_000;
/// Response header naming the `after` of the next page, present when more may follow.
pub const NEXT_AFTER_HEADER: &str = "sandpit-next-after";

/// One page of a token's statement log, read from the file a line at a time.
async fn token_statements(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    q: Result<Query<StatementsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let limit = q.limit.unwrap_or(STATEMENTS_PAGE);
    if !(1..=STATEMENTS_PAGE_MAX).contains(&limit) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit must be between 1 and {STATEMENTS_PAGE_MAX}"),
        );
    }
    let Some(rec) = s.gw.registry.get(&id) else {
        return error(StatusCode::NOT_FOUND, format!("unknown token {id}"));
    };
    let place = s.gw.config.log_place();
    // Outcomes its sessions deferred (see `TokenLog::defer_outcome`) are written first, so
    // every outcome already known is paired with its statement.
    s.gw.logs.flush(&rec.id);
    let after = q.after;
    let read = move || place.files(&rec.task, &rec.id)?.read_page(after, limit);
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(page)) => {
            let mut r = Json(page.statements).into_response();
            if let Some(next) = page.next_after {
                r.headers_mut()
                    .insert(NEXT_AFTER_HEADER, axum::http::HeaderValue::from(next));
            }
            r
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Query of `GET /v1/tokens/{id}/diff`.
#[derive(Debug, Deserialize)]
pub struct DiffQuery {
    /// json (default), text, sql or html.
    pub format: Option<String>,
    /// "all" compares every table, not only those the counters show as touched.
    pub scan: Option<String>,
    /// true: replay the patch on a fresh fork of the golden and compare (default false).
    pub verify: Option<bool>,
}

/// The review of a token: taken now while its backend exists, else the one stored when it
/// ended.
async fn token_diff(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<DiffQuery>,
) -> Response {
    use crate::review::reviewer::{reviews_dir, Reviewer};
    use crate::review::store::{self, Format};
    let Some(f) = Format::parse(q.format.as_deref().unwrap_or("json")) else {
        return error(
            StatusCode::BAD_REQUEST,
            "format must be json, text, sql or html",
        );
    };
    let Some(rec) = s.gw.registry.get(&id) else {
        return error(StatusCode::NOT_FOUND, format!("unknown token {id}"));
    };
    let body = if rec.state.is_usable() {
        let full = match q.scan.as_deref() {
            None | Some("touched") => false,
            Some("all") => true,
            Some(_) => return error(StatusCode::BAD_REQUEST, "scan must be touched or all"),
        };
        let reviewer = Reviewer::new(&s.gw.config, s.gw.provider.clone(), s.gw.gateway_id());
        let verify = q.verify.unwrap_or(false);
        // Outcomes its sessions deferred are written before the review reads the log.
        s.gw.logs.flush(&rec.id);
        let review = match store::take_verified(&reviewer, &rec, full, verify).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(token = %id, error = %e, "review failed");
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("review failed: {e}"),
                );
            }
        };
        let stmts = store::statements(&reviewer, &rec).unwrap_or_default();
        store::render(&review, &stmts, f)
    } else if let Some(why) = crate::registry::end::approval_refused(&rec) {
        // Files left by an end a crash cut short are not its review.
        return error(
            StatusCode::NOT_FOUND,
            format!("token {id} has ended and no review was stored: {why}"),
        );
    } else {
        match store::load(&reviews_dir(&s.gw.config), &rec.task, &rec.id, f) {
            Some(b) => b,
            None => {
                return error(
                    StatusCode::NOT_FOUND,
                    format!("token {id} has ended and no review was stored (review.on_end = false, or it failed)"),
                )
            }
        }
    };
    ([(axum::http::header::CONTENT_TYPE, f.content_type())], body).into_response()
}
