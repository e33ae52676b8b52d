//! What every worker route shares: the bearer-key check (constant time) and the JSON
//! error body of `docs/remote-provider.yaml`.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use subtle::ConstantTimeEq;

use super::Worker;
use crate::provider::remote_api::ApiError;

pub(super) fn err(status: StatusCode, msg: &str) -> Response {
    (status, Json(ApiError { error: msg.into() })).into_response()
}

pub(super) fn authorized(w: &Worker, h: &HeaderMap) -> bool {
    let Some(given) = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    bool::from(given.as_bytes().ct_eq(w.key.as_bytes()))
}
