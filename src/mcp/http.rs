//! MCP over streamable HTTP on the control API: `POST /mcp` takes one JSON-RPC message (or
//! batch) and answers `application/json`. The bearer is the whole token `<id>.<secret>`, so
//! an agent stack holds the same secret as with a DSN and nothing more. Stateless: no
//! `Mcp-Session-Id` is issued, and each request opens its own session through the gateway's
//! Postgres listener (SQL state such as an open transaction does not carry across requests).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use time::OffsetDateTime;

use super::review::ReviewSource;
use super::sql::SqlTarget;
use super::{McpServer, PROTOCOL_VERSIONS};
use crate::control::ApiState;

fn rpc_error(status: StatusCode, code: i64, msg: &str) -> Response {
    (
        status,
        Json(serde_json::json!({
            "jsonrpc": "2.0", "id": null, "error": { "code": code, "message": msg }
        })),
    )
        .into_response()
}

fn unauthorized(msg: &str) -> Response {
    metrics::counter!("sandpit_mcp_auth_failures_total").increment(1);
    let mut r = rpc_error(StatusCode::UNAUTHORIZED, -32001, msg);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"sandpit\""),
    );
    r
}

/// Where the MCP server reaches the gateway's own Postgres listener: its address, with an
/// unspecified host (0.0.0.0 / ::) replaced by loopback.
fn listener_addr(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, listen.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, listen.port()).into(),
        _ => listen,
    }
}

/// `POST /mcp`.
pub async fn post(State(s): State<ApiState>, headers: HeaderMap, body: Bytes) -> Response {
    // Browsers send Origin; agent stacks do not. Refusing it closes DNS rebinding (the spec's
    // MUST) without a list of allowed origins to configure.
    if headers.contains_key(header::ORIGIN) {
        return rpc_error(
            StatusCode::FORBIDDEN,
            -32600,
            "requests with an Origin header are refused",
        );
    }
    if let Some(v) = headers.get("mcp-protocol-version") {
        let ok = v
            .to_str()
            .map(|v| PROTOCOL_VERSIONS.contains(&v))
            .unwrap_or(false);
        if !ok {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                -32600,
                "unsupported MCP-Protocol-Version",
            );
        }
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let Some((id, secret)) = crate::auth::parse_full_token(bearer) else {
        return unauthorized("Authorization: Bearer <token id>.<secret> required");
    };
    let rec = match s.gw.registry.lookup(id).await {
        Ok(Some(rec)) => rec,
        Ok(None) => return unauthorized("unknown token"),
        Err(e) => {
            tracing::error!(error = %e, "mcp: registry unavailable");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "token registry unavailable",
            )
                .into_response();
        }
    };
    if !rec.verifier.check_cleartext(secret) {
        return unauthorized("wrong token secret");
    }
    // Only the holder of the secret learns that the token ended.
    if !rec.state.is_usable() || rec.expires_at <= OffsetDateTime::now_utc() {
        return unauthorized("token has expired or been revoked");
    }

    let addr = listener_addr(s.gw.config.listen);
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(addr.ip().to_string())
        .port(addr.port())
        .user(id)
        .password(secret)
        .dbname("sandpit")
        .application_name("sandpit-mcp")
        .connect_timeout(std::time::Duration::from_secs(30));
    let review = ReviewSource::InProcess {
        gw: s.gw.clone(),
        token: rec.id.clone(),
    };
    let server = McpServer::with_review(SqlTarget::from_config(cfg), review);
    metrics::counter!("sandpit_mcp_requests_total", "transport" => "http").increment(1);
    match server.handle_bytes(&body).await {
        Some(v) => (StatusCode::OK, Json(v)).into_response(),
        // Notifications and responses: accepted, nothing to say.
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// `GET /mcp`: no server-initiated stream is offered.
pub async fn get() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "this MCP endpoint answers POST only\n",
    )
        .into_response()
}
