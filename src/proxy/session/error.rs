//! Why a session ends before its relay starts, and what the client is told: every refusal
//! of `session/mod.rs` is one of these, reported at one exit ([`SessionError::report`]).

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::proxy::auth_flow::{AuthError, TOO_MANY_FAILURES};
use crate::registry::TokenState;
use crate::wire::messages::{self, Severity};
use crate::wire::startup::StartupError;

/// A session refused before relaying; each knows its SQLSTATE and client message.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection is gone, or closes without a word (a failed write, a timeout before
    /// startup): nothing is sent.
    #[error("connection closed")]
    Closed,
    /// A malformed startup or encryption request.
    #[error("{0}")]
    Startup(StartupError),
    #[error("replication connections are not supported by sandpit")]
    Replication,
    /// A startup `options` value the gateway forbids (the message says which).
    #[error("{0}")]
    ForbiddenOption(String),
    #[error("database \"{0}\" does not exist (sandpit serves each token's database as \"{1}\")")]
    NoSuchDatabase(String, String),
    #[error("no user name in the startup packet; the user name is the token id")]
    NoUser,
    /// Authentication failed (the failure was counted where it happened).
    #[error(transparent)]
    Auth(AuthError),
    #[error("{}", TOO_MANY_FAILURES)]
    RateLimited,
    #[error("authentication timed out")]
    AuthTimeout,
    #[error("too many connections for token \"{id}\" (max_connections is {max})")]
    TooManyConnections { id: String, max: u32 },
    #[error("too many new connections for token \"{id}\" (limits.sessions_per_second is {rate} after a burst of {burst}); try again shortly")]
    TooManyNewSessions { id: String, rate: u32, burst: u32 },
    #[error("token \"{0}\" is {1}")]
    NotUsable(String, TokenState),
    /// The scratch database could not be started (the detail is in the gateway's log).
    #[error("could not start the scratch database for this token")]
    BackendUnavailable,
    /// The scratch database could not be reached, also after a second try.
    #[error("could not connect to the scratch database for this token")]
    BackendUnreachable,
    /// The backend's own ErrorResponse, already scrubbed of the gateway's secrets.
    #[error("the scratch database refused the session")]
    BackendRefused(Bytes),
    #[error("scratch database sent no cancel key")]
    NoCancelKey,
    #[error("sandpit cannot record this session's cancel key")]
    CancelKeyNotRecorded,
    /// The shared registry could not count or record the session (fronts).
    #[error("sandpit cannot record this session")]
    SessionNotRecorded,
    /// No statement may run unrecorded.
    #[error("sandpit cannot write the statement log for this token")]
    LogUnavailable,
}

impl SessionError {
    /// The SQLSTATE the client sees.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            SessionError::Closed | SessionError::BackendRefused(_) => "",
            SessionError::Startup(_) | SessionError::AuthTimeout | SessionError::NoCancelKey => {
                "08P01"
            }
            SessionError::Replication => "0A000",
            SessionError::NoSuchDatabase(..) => "3D000",
            SessionError::ForbiddenOption(_) => "42501",
            SessionError::Auth(e) => e.sqlstate(),
            SessionError::NoUser | SessionError::RateLimited | SessionError::NotUsable(..) => {
                "28000"
            }
            SessionError::TooManyConnections { .. } | SessionError::TooManyNewSessions { .. } => {
                "53300"
            }
            SessionError::BackendUnavailable
            | SessionError::BackendUnreachable
            | SessionError::CancelKeyNotRecorded
            | SessionError::SessionNotRecorded => "08006",
            SessionError::LogUnavailable => "58030",
        }
    }

    /// The bytes the client is sent, if any: a FATAL ErrorResponse, or the backend's own.
    pub fn reply(&self) -> Option<Bytes> {
        match self {
            SessionError::Closed | SessionError::Auth(AuthError::Lost) => None,
            SessionError::BackendRefused(raw) => Some(raw.clone()),
            e => Some(messages::error_response(
                Severity::Fatal,
                e.sqlstate(),
                &e.to_string(),
            )),
        }
    }

    /// The one exit of a refused session: send the reply, then close (a FATAL ends with a
    /// shutdown; the backend's own refusal is passed on as it came).
    pub async fn report<W: AsyncWrite + Unpin>(self, w: &mut W) {
        let Some(reply) = self.reply() else {
            return;
        };
        let _ = async {
            w.write_all(&reply).await?;
            w.flush().await
        }
        .await;
        if !matches!(self, SessionError::BackendRefused(_)) {
            let _ = w.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_carries_its_sqlstate_and_message() {
        let fatal = |e: SessionError| {
            let reply = e.reply().expect("a reply");
            let text = String::from_utf8_lossy(&reply).into_owned();
            assert!(text.contains("FATAL"), "{text}");
            assert!(text.contains(e.sqlstate()), "{text}");
            assert!(text.contains(&e.to_string()), "{text}");
        };
        fatal(SessionError::Replication);
        fatal(SessionError::NotUsable("sp_x".into(), TokenState::Revoked));
        fatal(SessionError::Auth(AuthError::WrongSecret("sp_x".into())));
        fatal(SessionError::TooManyConnections {
            id: "sp_x".into(),
            max: 2,
        });
        fatal(SessionError::TooManyNewSessions {
            id: "sp_x".into(),
            rate: 20,
            burst: 20,
        });
        assert_eq!(
            SessionError::NotUsable("sp_x".into(), TokenState::Expired).to_string(),
            "token \"sp_x\" is expired"
        );
        assert_eq!(SessionError::RateLimited.sqlstate(), "28000");
        assert_eq!(SessionError::LogUnavailable.sqlstate(), "58030");
        // Nothing is said to a client that is gone, and a backend's refusal passes as it came.
        assert!(SessionError::Closed.reply().is_none());
        assert!(SessionError::Auth(AuthError::Lost).reply().is_none());
        let raw = Bytes::from_static(b"E\0\0\0\x04");
        assert_eq!(SessionError::BackendRefused(raw.clone()).reply(), Some(raw));
    }
}
