//! Connecting to a backend as the agent role and reading it up to its first ReadyForQuery.

use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use super::scram::ScramClient;
use super::stream::{self as backend_stream, BackendStream};
use super::BackendTarget;
use crate::wire::frame::{build, FrameReader};
use crate::wire::messages;
use crate::wire::startup::encode_startup;

/// A backend connection that finished startup.
pub struct BackendConn {
    /// Frames from the backend (and the socket to write to).
    pub reader: FrameReader<BackendStream>,
    /// ParameterStatus and NoticeResponse frames to pass on, in order.
    pub greeting: Vec<Bytes>,
    /// The real key (pid, secret).
    pub key: Option<(i32, i32)>,
    /// The ReadyForQuery frame.
    pub ready: Bytes,
}

/// Why a backend connection failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Could not reach the socket (or finish TLS with it).
    #[error("cannot connect to backend: {0}")]
    Connect(std::io::Error),
    /// The backend refused the session; the (raw) ErrorResponse to pass on, scrubbed by the caller.
    #[error("backend refused the session")]
    Refused(Bytes),
    /// Anything unexpected.
    #[error("backend protocol: {0}")]
    Protocol(String),
    /// The login's one-time password could not be set, or was changed during the login.
    #[error("backend login gate: {0}")]
    Gate(String),
}

/// Connect and run startup. `params` are the client's startup parameters to pass on, values
/// as the raw bytes the client sent.
pub async fn connect(
    target: &BackendTarget,
    params: &[(&str, &[u8])],
    max_message: usize,
) -> Result<BackendConn, BackendError> {
    // A backend that accepts the connection but never finishes startup must not hold the
    // client forever (remote backends can be anything).
    super::gate::login(
        target,
        async |t: &BackendTarget| {
            tokio::time::timeout(STARTUP_TIMEOUT, startup(t, params, max_message))
                .await
                .map_err(|_| BackendError::Protocol("backend startup timed out".into()))?
        },
        BackendError::Gate,
    )
    .await
}

/// Bound on connect + auth + reaching ReadyForQuery.
const STARTUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn startup(
    target: &BackendTarget,
    params: &[(&str, &[u8])],
    max_message: usize,
) -> Result<BackendConn, BackendError> {
    let sock = backend_stream::open(&target.endpoint)
        .await
        .map_err(BackendError::Connect)?;
    let mut all: Vec<(&str, &[u8])> = vec![
        ("user", target.user.as_bytes()),
        ("database", target.database.as_bytes()),
    ];
    all.extend_from_slice(params);
    let mut reader = FrameReader::new(sock, max_message);
    let io = |e: std::io::Error| BackendError::Protocol(e.to_string());
    reader
        .get_mut()
        .write_all(&encode_startup(&all))
        .await
        .map_err(io)?;
    let mut scram: Option<ScramClient> = None;
    let mut greeting = Vec::new();
    let mut key = None;
    loop {
        let f = match reader.read_frame().await {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Err(BackendError::Protocol(
                    "backend closed during startup".into(),
                ))
            }
            Err(e) => return Err(BackendError::Protocol(e.to_string())),
        };
        match f.tag {
            b'R' => {
                let code = messages::auth_code(f.body())
                    .ok_or_else(|| BackendError::Protocol("bad auth message".into()))?;
                let password = target.password.as_deref();
                let reply = match (code, password) {
                    (0, _) => None,
                    (3, Some(pw)) => {
                        let mut b = pw.as_bytes().to_vec();
                        b.push(0);
                        Some(build(b'p', &b))
                    }
                    (5, Some(pw)) => {
                        let salt: [u8; 4] = f
                            .body()
                            .get(4..8)
                            .and_then(|s| s.try_into().ok())
                            .ok_or_else(|| BackendError::Protocol("bad MD5 salt".into()))?;
                        let hash = postgres_protocol::authentication::md5_hash(
                            target.user.as_bytes(),
                            pw.as_bytes(),
                            salt,
                        );
                        let mut b = hash.into_bytes();
                        b.push(0);
                        Some(build(b'p', &b))
                    }
                    (10, Some(pw)) => {
                        // Keys cached per (role, password, salt, count): see [`super::scram`].
                        let s = ScramClient::new(&target.user, pw);
                        let mut b = b"SCRAM-SHA-256\0".to_vec();
                        b.extend_from_slice(&(s.message().len() as i32).to_be_bytes());
                        b.extend_from_slice(s.message());
                        scram = Some(s);
                        Some(build(b'p', &b))
                    }
                    (11, _) => {
                        let s = scram.as_mut().ok_or_else(|| {
                            BackendError::Protocol("SASL continue without start".into())
                        })?;
                        s.update(f.body().get(4..).unwrap_or(&[]))
                            .await
                            .map_err(io)?;
                        Some(build(b'p', s.message()))
                    }
                    (12, _) => {
                        let mut s = scram.take().ok_or_else(|| {
                            BackendError::Protocol("SASL final without start".into())
                        })?;
                        s.finish(f.body().get(4..).unwrap_or(&[])).map_err(io)?;
                        None
                    }
                    (code, _) => {
                        return Err(BackendError::Protocol(format!(
                            "unsupported backend auth method {code}"
                        )))
                    }
                };
                if let Some(r) = reply {
                    reader.get_mut().write_all(&r).await.map_err(io)?;
                }
            }
            b'S' | b'N' => greeting.push(f.raw),
            b'K' => key = messages::backend_key(f.body()),
            b'E' => return Err(BackendError::Refused(f.raw)),
            b'Z' => {
                return Ok(BackendConn {
                    reader,
                    greeting,
                    key,
                    ready: f.raw,
                })
            }
            b'v' => {} // NegotiateProtocolVersion: we asked for 3.0 only, nothing to do.
            other => {
                return Err(BackendError::Protocol(format!(
                    "unexpected message {:?} during startup",
                    other as char
                )))
            }
        }
    }
}
