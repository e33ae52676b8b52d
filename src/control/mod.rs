//! The HTTP control API for the harness (bearer admin key): issue, list, show, revoke
//! tokens; `/metrics` (Prometheus text) and `/healthz` without auth.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::lifecycle::{EndReason, Gateway, IssueRequest, LifecycleError};

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
    /// Statement timeout in ms (0 = none).
    pub statement_timeout_ms: Option<u64>,
    /// Idle-in-transaction timeout in ms (0 = none).
    pub idle_in_transaction_timeout_ms: Option<u64>,
    /// Metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// The router.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/tokens", get(list_tokens).post(issue_token))
        .route("/v1/tokens/{id}", get(show_token).delete(revoke_token))
        .route("/v1/tokens/{id}/statements", get(token_statements))
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

fn check_auth(state: &ApiState, headers: &HeaderMap) -> Result<(), Response> {
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

fn lifecycle_error(e: LifecycleError) -> Response {
    match e {
        LifecycleError::Unknown(id) => error(StatusCode::NOT_FOUND, format!("unknown token {id}")),
        LifecycleError::Invalid(m) => error(StatusCode::BAD_REQUEST, m),
        other => {
            tracing::error!(error = %other, "api request failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
        }
    }
}

async fn issue_token(
    State(s): State<ApiState>,
    headers: HeaderMap,
    body: Result<Json<IssueBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Err(r) = check_auth(&s, &headers) {
        return r;
    }
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
        statement_timeout: b.statement_timeout_ms.map(Duration::from_millis),
        idle_in_transaction_timeout: b.idle_in_transaction_timeout_ms.map(Duration::from_millis),
        metadata: b.metadata,
    };
    match s.gw.issue(req) {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => lifecycle_error(e),
    }
}

async fn list_tokens(State(s): State<ApiState>, headers: HeaderMap) -> Response {
    if let Err(r) = check_auth(&s, &headers) {
        return r;
    }
    let views: Vec<_> = s.gw.registry.list().iter().map(|r| s.gw.view(r)).collect();
    Json(views).into_response()
}

async fn show_token(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = check_auth(&s, &headers) {
        return r;
    }
    match s.gw.registry.get(&id) {
        Some(r) => Json(s.gw.view(&r)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("unknown token {id}")),
    }
}

async fn revoke_token(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = check_auth(&s, &headers) {
        return r;
    }
    match s.gw.end(&id, EndReason::Revoked).await {
        Ok(_) => match s.gw.registry.get(&id) {
            Some(r) => Json(s.gw.view(&r)).into_response(),
            None => error(StatusCode::NOT_FOUND, format!("unknown token {id}")),
        },
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
            h.render(),
        )
            .into_response(),
        None => error(StatusCode::NOT_FOUND, "metrics recorder not installed"),
    }
}

async fn token_statements(
    State(s): State<ApiState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = check_auth(&s, &headers) {
        return r;
    }
    let Some(rec) = s.gw.registry.get(&id) else {
        return error(StatusCode::NOT_FOUND, format!("unknown token {id}"));
    };
    let path = crate::review::log::log_path(&s.gw.config.data_dir, &rec.task, &rec.id);
    match tokio::task::spawn_blocking(move || crate::review::log::read_statements(&path)).await {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
