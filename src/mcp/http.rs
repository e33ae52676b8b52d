//! MCP over streamable HTTP on the control API: `POST /mcp` takes one JSON-RPC message (or
//! batch) and answers `application/json`. The bearer is the whole token `<id>.<secret>`, so
//! an agent stack holds the same secret as with a DSN and nothing more. Stateless: no
//! `Mcp-Session-Id` is issued, and each request opens its own session through the gateway's
//! Postgres listener (SQL state such as an open transaction does not carry across requests).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};

use super::review::ReviewSource;
use super::sql::SqlTarget;
use super::{McpServer, PROTOCOL_VERSIONS};
use crate::lifecycle::Gateway;
use crate::proxy::auth_flow::{check_secret, over_limit, AuthError, TOO_MANY_FAILURES};

/// State of the `/mcp` routes.
#[derive(Clone)]
pub struct McpState {
    /// The gateway.
    pub gw: Arc<Gateway>,
}

/// The `/mcp` routes, with their own state; the control API merges them into its router.
pub fn router(state: McpState) -> Router {
    Router::new()
        .route("/mcp", get(get_mcp).post(post))
        .with_state(state)
}

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

/// `POST /mcp`. The peer address (present when the API is served with connect info) is
/// what failures with an unknown token id count against in the auth limiter.
pub async fn post(
    State(s): State<McpState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
    let peer = peer.map(|Extension(ConnectInfo(a))| a.ip());
    let Some((id, secret)) = crate::auth::parse_full_token(bearer) else {
        // Counted like a cleartext password that is no token.
        let e = AuthError::UnknownToken("(not a token)".into());
        if over_limit(&s.gw, &e, peer).await {
            return unauthorized(TOO_MANY_FAILURES);
        }
        return unauthorized("Authorization: Bearer <token id>.<secret> required");
    };
    let rec = match check_secret(&s.gw, id, secret).await {
        Ok(rec) => rec,
        Err(AuthError::Registry(e)) => {
            tracing::error!(error = %e, "mcp: registry unavailable");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "token registry unavailable",
            )
                .into_response();
        }
        Err(e) => {
            // Counted with the Postgres listener's failures: one budget per key.
            if over_limit(&s.gw, &e, peer).await {
                return unauthorized(TOO_MANY_FAILURES);
            }
            return unauthorized(match e {
                AuthError::UnknownToken(_) => "unknown token",
                AuthError::WrongSecret(_) => "wrong token secret",
                // Only the holder of the secret learns that the token ended.
                _ => "token has expired or been revoked",
            });
        }
    };

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
    let server = McpServer::with_review(
        SqlTarget::from_config(cfg).with_max_bytes(rec.caps.max_bytes),
        review,
    );
    metrics::counter!("sandpit_mcp_requests_total", "transport" => "http").increment(1);
    match server.handle_bytes(&body).await {
        Some(v) => (StatusCode::OK, Json(v)).into_response(),
        // Notifications and responses: accepted, nothing to say.
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// `GET /mcp`: no server-initiated stream is offered.
pub async fn get_mcp() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "this MCP endpoint answers POST only\n",
    )
        .into_response()
}
