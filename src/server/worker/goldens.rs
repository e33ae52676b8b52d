//! The worker's golden versions routes (an optional extension of `docs/remote-provider.yaml`):
//! list the node's versions, build one from a live database under the id its front chose,
//! and put one in use for new sandboxes. The build's DSN arrives in the body over the API's
//! TLS; it is never logged nor echoed (errors show the source without its password).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::answer::{authorized, err};
use super::Worker;
use crate::provider::golden::live::LiveSpec;
use crate::provider::remote_api::{BuildGolden, GoldenList};
use crate::provider::{GoldenVersions, ProviderError};

/// The node's versions, or the answer that says why there are none (401, 501).
fn versions<'w>(w: &'w Worker, h: &HeaderMap) -> Result<&'w dyn GoldenVersions, Box<Response>> {
    if !authorized(w, h) {
        tracing::warn!("worker API: request without the right bearer key");
        return Err(Box::new(err(StatusCode::UNAUTHORIZED, "bad api key")));
    }
    w.provider.versions().ok_or_else(|| {
        Box::new(err(
            StatusCode::NOT_IMPLEMENTED,
            "this worker's provider keeps no golden versions",
        ))
    })
}

fn failed(e: ProviderError) -> Response {
    match e {
        ProviderError::Invalid(m) => err(StatusCode::BAD_REQUEST, &m),
        e @ ProviderError::InvalidMask(_) => err(StatusCode::BAD_REQUEST, &e.to_string()),
        ProviderError::NotFound(m) => err(StatusCode::NOT_FOUND, &format!("unknown {m}")),
        other => {
            tracing::error!(error = %other, "worker: golden request failed");
            err(StatusCode::INTERNAL_SERVER_ERROR, &other.to_string())
        }
    }
}

/// `GET /v1/goldens`.
pub(super) async fn list(State(w): State<Arc<Worker>>, h: HeaderMap) -> Response {
    let v = match versions(&w, &h) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    match v.goldens().await {
        Ok(goldens) => Json(GoldenList { goldens }).into_response(),
        Err(e) => failed(e),
    }
}

/// `POST /v1/goldens`: builds version `id` (not put in use); answers when done.
pub(super) async fn build(
    State(w): State<Arc<Worker>>,
    h: HeaderMap,
    body: Result<Json<BuildGolden>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let v = match versions(&w, &h) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    // The rejection text may quote the body (and so the DSN): only its status is said.
    let Json(b) = match body {
        Ok(b) => b,
        Err(e) => {
            return err(
                StatusCode::BAD_REQUEST,
                &format!(
                    "body must be JSON {{\"id\", \"from_dsn\", \"schemas\", \"exclude_tables\", \"mask\"}} ({})",
                    e.status()
                ),
            )
        }
    };
    let spec = match LiveSpec::from_request(
        &b.from_dsn,
        b.schemas,
        b.exclude_tables,
        b.mask,
        Some(b.id),
    ) {
        Ok(spec) => spec,
        Err(e) => return failed(e),
    };
    match v.build_golden(&spec).await {
        Ok(g) => (StatusCode::CREATED, Json(g)).into_response(),
        Err(e) => failed(e),
    }
}

/// `POST /v1/goldens/{id}/use`: the worker's new sandboxes copy this version from now on.
pub(super) async fn use_version(
    State(w): State<Arc<Worker>>,
    h: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let v = match versions(&w, &h) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    match v.use_golden(&id).await {
        Ok(g) => Json(g).into_response(),
        Err(e) => failed(e),
    }
}
