//! Authenticating the client: SCRAM-SHA-256 when the user name is a token id (and
//! SCRAM-SHA-256-PLUS as well over TLS), otherwise a cleartext password holding the whole
//! token (`<id>.<secret>`), only over TLS or loopback. [`check_token`] is the one token
//! check, also used by MCP over HTTP, and [`over_limit`] counts failures of both.

use time::OffsetDateTime;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::auth::ratelimit::{Key, TARPIT};
use crate::auth::scram::Binding;
use crate::auth::{self, ScramError, ScramServer};
use crate::lifecycle::Gateway;
use crate::registry::{TokenRecord, TokenState};
use crate::wire::frame::FrameReader;
use crate::wire::messages;

/// Why a client was not let in; each maps to the SQLSTATE the contract names.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("token \"{0}\" is unknown")]
    UnknownToken(String),
    /// A cleartext password that is no token, for a user name that is none either: to the
    /// client a failed password, as a server says it (its user name is its own).
    #[error("password authentication failed for user \"{0}\"")]
    NotAToken(String),
    #[error("password authentication failed for token \"{0}\"")]
    WrongSecret(String),
    #[error("token \"{0}\" has {phrase}{why}", phrase = ended_phrase(*.1),
        why = .2.as_deref().map(|w| format!(": {w}")).unwrap_or_default())]
    Ended(String, TokenState, Option<String>),
    #[error("cleartext password authentication requires TLS on this connection; use sslmode=require or SCRAM")]
    CleartextNeedsTls,
    #[error("invalid authentication message: {0}")]
    Protocol(String),
    #[error("connection lost during authentication")]
    Lost,
    #[error("the token registry is unavailable")]
    Registry(#[from] crate::registry::RegistryError),
}

impl AuthError {
    /// SQLSTATE for the client.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            AuthError::WrongSecret(_) | AuthError::NotAToken(_) => "28P01",
            AuthError::UnknownToken(_) | AuthError::Ended(..) | AuthError::CleartextNeedsTls => {
                "28000"
            }
            AuthError::Protocol(_) | AuthError::Lost => "08P01",
            AuthError::Registry(_) => "08006",
        }
    }

    /// What the failure counts against in the rate limiter, if it counts: a wrong secret
    /// against its (existing) token id, an unknown id against the client's address.
    pub fn limit_key(&self, peer: std::net::IpAddr) -> Option<Key> {
        match self {
            AuthError::WrongSecret(id) => Some(Key::Token(id.clone())),
            AuthError::UnknownToken(_) | AuthError::NotAToken(_) => Some(Key::unknown_from(peer)),
            _ => None,
        }
    }

    /// Label for the auth failure metric.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::UnknownToken(_) | AuthError::NotAToken(_) => "unknown",
            AuthError::WrongSecret(_) => "wrong_secret",
            AuthError::Ended(_, TokenState::Revoked, _) => "revoked",
            AuthError::Ended(..) => "expired",
            AuthError::CleartextNeedsTls => "cleartext_without_tls",
            AuthError::Protocol(_) | AuthError::Lost => "protocol",
            AuthError::Registry(_) => "registry",
        }
    }
}

/// The one token check (Postgres auth and MCP over HTTP): the record of token `id`, once
/// `prove` has shown the caller holds its secret, if the token may still be used.
pub async fn check_token(
    gw: &Gateway,
    id: &str,
    prove: impl AsyncFnOnce(&TokenRecord) -> Result<(), AuthError>,
) -> Result<TokenRecord, AuthError> {
    let rec = gw
        .registry
        .lookup(id)
        .await?
        .ok_or_else(|| AuthError::UnknownToken(id.to_string()))?;
    prove(&rec).await?;
    // Only someone holding the secret learns that the token ended.
    if !rec.state.is_usable() {
        return Err(AuthError::Ended(rec.id, rec.state, rec.ended_why));
    }
    if rec.expires_at <= OffsetDateTime::now_utc() {
        return Err(AuthError::Ended(rec.id, TokenState::Expired, None));
    }
    Ok(rec)
}

/// [`check_token`] with the secret itself as the proof (a cleartext password, an MCP bearer).
pub async fn check_secret(gw: &Gateway, id: &str, secret: &str) -> Result<TokenRecord, AuthError> {
    check_token(gw, id, async |rec: &TokenRecord| {
        if rec.verifier.check_cleartext(secret) {
            Ok(())
        } else {
            Err(AuthError::WrongSecret(rec.id.clone()))
        }
    })
    .await
}

/// Count a failure in the gateway's limiter (Postgres and MCP alike; `peer` unknown: an
/// unknown id is not counted). When its key is over the limit, this waits [`TARPIT`] and
/// returns true: the caller then refuses with `too many authentication failures`.
pub async fn over_limit(gw: &Gateway, e: &AuthError, peer: Option<std::net::IpAddr>) -> bool {
    let Some(key) = peer.and_then(|p| e.limit_key(p)).or_else(|| match e {
        AuthError::WrongSecret(id) => Some(Key::Token(id.clone())),
        _ => None,
    }) else {
        return false;
    };
    if !gw.auth_failed(&key).await {
        return false;
    }
    metrics::counter!("sandpit_auth_rate_limited_total").increment(1);
    tokio::time::sleep(TARPIT).await;
    true
}

/// What a client over the limit is told.
pub const TOO_MANY_FAILURES: &str = "too many authentication failures, try later";

/// Run the authentication exchange; returns the token record on success (AuthenticationOk
/// already sent). `channel_binding` is the TLS certificate's tls-server-end-point data when
/// the client is on TLS: SCRAM-SHA-256-PLUS is offered then.
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    gw: &Gateway,
    conn: &mut FrameReader<S>,
    user: &str,
    cleartext_allowed: bool,
    channel_binding: Option<&[u8]>,
) -> Result<TokenRecord, AuthError> {
    let rec = if auth::token::is_token_id(user) {
        check_token(gw, user, async |rec: &TokenRecord| {
            scram(conn, rec, channel_binding).await
        })
        .await?
    } else {
        if !cleartext_allowed {
            return Err(AuthError::CleartextNeedsTls);
        }
        send(conn, &messages::auth_cleartext()).await?;
        let f = read_password_frame(conn).await?;
        let pw = messages::password_message(f.body())
            .ok_or_else(|| AuthError::Protocol("malformed password message".into()))?;
        let pw = std::str::from_utf8(pw)
            .map_err(|_| AuthError::Protocol("password is not UTF-8".into()))?;
        let (id, secret) =
            auth::parse_full_token(pw).ok_or_else(|| AuthError::NotAToken(user.to_string()))?;
        check_secret(gw, id, secret).await?
    };
    send(conn, &messages::auth_ok()).await?;
    Ok(rec)
}

/// How a client is told its token ended: a live one past its TTL has expired too.
fn ended_phrase(s: TokenState) -> &'static str {
    match s {
        TokenState::Revoked => "been revoked",
        _ => "expired",
    }
}

async fn scram<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut FrameReader<S>,
    rec: &TokenRecord,
    channel_binding: Option<&[u8]>,
) -> Result<(), AuthError> {
    // Like PostgreSQL: -PLUS first, so that clients that can bind do.
    let offer: &[&str] = match channel_binding {
        Some(_) => &["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"],
        None => &["SCRAM-SHA-256"],
    };
    send(conn, &messages::auth_sasl(offer)).await?;
    let f = read_password_frame(conn).await?;
    let (mech, data) = messages::sasl_initial_response(f.body())
        .ok_or_else(|| AuthError::Protocol("malformed SASLInitialResponse".into()))?;
    if !offer.contains(&mech) {
        return Err(AuthError::Protocol(format!(
            "unsupported SASL mechanism {mech:?}"
        )));
    }
    let binding = Binding {
        offered: channel_binding,
        plus: mech == "SCRAM-SHA-256-PLUS",
    };
    let (state, server_first) = ScramServer::start_bound(&rec.verifier.scram, data, binding)
        .map_err(|e| AuthError::Protocol(e.to_string()))?;
    send(conn, &messages::auth_sasl_continue(&server_first)).await?;
    let f = read_password_frame(conn).await?;
    match state.finish(f.body()) {
        Ok(server_final) => send(conn, &messages::auth_sasl_final(&server_final)).await,
        Err(ScramError::BadProof) => Err(AuthError::WrongSecret(rec.id.clone())),
        Err(e) => Err(AuthError::Protocol(e.to_string())),
    }
}

async fn read_password_frame<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut FrameReader<S>,
) -> Result<crate::wire::Frame, AuthError> {
    match conn.read_frame().await {
        Ok(Some(f)) if f.tag == b'p' => Ok(f),
        Ok(Some(f)) => Err(AuthError::Protocol(format!(
            "expected a password message, got {:?}",
            f.tag as char
        ))),
        Ok(None) => Err(AuthError::Lost),
        Err(e) => Err(AuthError::Protocol(e.to_string())),
    }
}

async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut FrameReader<S>,
    msg: &[u8],
) -> Result<(), AuthError> {
    let s = conn.get_mut();
    s.write_all(msg).await.map_err(|_| AuthError::Lost)?;
    s.flush().await.map_err(|_| AuthError::Lost)
}
