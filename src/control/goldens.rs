//! `/v1/goldens`: list golden versions, build one from a live database, switch new tokens
//! to one. The source DSN is taken from the request body only; it is never logged or
//! echoed (errors and listings show it without its password).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{error, ApiState};
use crate::provider::golden::live::LiveSpec;
use crate::provider::ProviderError;

/// Body of `POST /v1/goldens`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildBody {
    /// DSN of the source database (read only, in one read-only transaction).
    pub from_dsn: String,
    /// Only these schemas (all when empty).
    #[serde(default)]
    pub schemas: Vec<String>,
    /// Tables left out (`pg_dump --exclude-table` patterns).
    #[serde(default)]
    pub exclude_tables: Vec<String>,
    /// Masking rules, the text of a TOML rules file.
    #[serde(default)]
    pub mask: Option<String>,
    /// Use the new version for new tokens right away.
    #[serde(default)]
    pub activate: bool,
}

fn provider_error(e: ProviderError) -> Response {
    match e {
        ProviderError::Invalid(m) => error(StatusCode::BAD_REQUEST, m),
        e @ ProviderError::InvalidMask(_) => error(StatusCode::BAD_REQUEST, e.to_string()),
        ProviderError::NotFound(m) => error(StatusCode::NOT_FOUND, format!("unknown {m}")),
        ProviderError::Unsupported(m) => error(StatusCode::NOT_IMPLEMENTED, m),
        ProviderError::Refused(m) => error(StatusCode::CONFLICT, m),
        other => {
            tracing::error!(error = %other, "golden request failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
        }
    }
}

/// The answer for a provider without golden versions ([`Provider::versions`] is None).
///
/// [`Provider::versions`]: crate::provider::Provider::versions
fn unsupported(s: &ApiState) -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "golden versions and golden build are supported with the instance and microvm providers and on remote fronts over sandpit workers (remote.urls), not {}",
            s.gw.provider.name()
        ),
    )
}

/// `GET /v1/goldens`.
pub async fn list(State(s): State<ApiState>) -> Response {
    let Some(versions) = s.gw.provider.versions() else {
        return unsupported(&s);
    };
    match versions.goldens().await {
        Ok(v) => Json(v).into_response(),
        Err(e) => provider_error(e),
    }
}

/// `POST /v1/goldens`: builds (and with `activate`, uses) a new version; answers when done.
pub async fn build(
    State(s): State<ApiState>,
    body: Result<Json<BuildBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(b) = match body {
        // The rejection text may quote the body: say only what kind of problem it was.
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "body must be JSON {{\"from_dsn\", \"schemas\", \"exclude_tables\", \"mask\", \"activate\"}} ({})",
                    e.status()
                ),
            )
        }
        Ok(b) => b,
    };
    let spec = match LiveSpec::from_request(&b.from_dsn, b.schemas, b.exclude_tables, b.mask, None)
    {
        Ok(spec) => spec,
        Err(e) => return provider_error(e),
    };
    let Some(versions) = s.gw.provider.versions() else {
        return unsupported(&s);
    };
    let built = match versions.build_golden(&spec).await {
        Ok(g) => g,
        Err(e) => return provider_error(e),
    };
    let info = if b.activate {
        match versions.use_golden(&built.id).await {
            Ok(g) => g,
            Err(e) => return provider_error(e),
        }
    } else {
        built
    };
    (StatusCode::CREATED, Json(info)).into_response()
}

/// `POST /v1/goldens/{id}/use`: new tokens' forks copy this version from now on.
pub async fn use_version(State(s): State<ApiState>, Path(id): Path<String>) -> Response {
    let Some(versions) = s.gw.provider.versions() else {
        return unsupported(&s);
    };
    match versions.use_golden(&id).await {
        Ok(g) => Json(g).into_response(),
        Err(e) => provider_error(e),
    }
}
