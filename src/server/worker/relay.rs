//! A worker's TCP door to one scratch server. Instance servers listen on a unix socket only;
//! a front reaches one through this relay, which takes TLS (when the worker has it), asks
//! for the fork's own password (cleartext, so only inside TLS in practice), checks the role,
//! and then hands the untouched startup message and every later byte to the socket, where
//! the server's peer authentication lets the worker's user in. A cancel request (which
//! carries its own secret) is relayed without a password, as Postgres itself does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio_rustls::TlsAcceptor;

use crate::wire::messages::{self, Severity};
use crate::wire::startup::{parse_startup, StartupPacket, SSL_REQUEST};

/// Longest startup packet accepted (Postgres allows 10 000 bytes).
const MAX_STARTUP: usize = 10_000;
/// Longest password message accepted.
const MAX_PASSWORD: usize = 1024;
/// Time a front has to get through TLS and the password.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What the relay of one fork needs.
pub(super) struct Door {
    /// The scratch server's socket.
    pub socket: PathBuf,
    /// The only role a front may log in as.
    pub user: String,
    /// The fork's password (never given to an agent: fronts log in, agents talk to fronts).
    pub password: String,
    /// TLS of the worker; when set, TLS is required.
    pub tls: Option<TlsAcceptor>,
}

/// Serves the door until the task is aborted (the sandbox deleted).
pub(super) async fn serve(l: TcpListener, door: Arc<Door>) {
    loop {
        let tcp = match l.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "worker relay: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let door = door.clone();
        tokio::spawn(async move {
            if let Err(e) = relay(tcp, &door).await {
                tracing::debug!(error = %e, "worker relay: connection ended");
            }
        });
    }
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// One packet of the startup phase: its bytes (length included) and its body.
async fn packet<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let n = u32::from_be_bytes(len) as usize;
    if !(8..=MAX_STARTUP).contains(&n) {
        return Err(bad("startup packet length out of bounds"));
    }
    let mut buf = vec![0u8; n];
    buf[..4].copy_from_slice(&len);
    s.read_exact(&mut buf[4..]).await?;
    Ok(buf)
}

async fn relay(mut tcp: TcpStream, door: &Door) -> std::io::Result<()> {
    let first = tokio::time::timeout(LOGIN_TIMEOUT, packet(&mut tcp))
        .await
        .map_err(|_| bad("login timed out"))??;
    let code = u32::from_be_bytes([first[4], first[5], first[6], first[7]]);
    match (&door.tls, code == SSL_REQUEST) {
        (Some(acceptor), true) => {
            tcp.write_all(b"S").await?;
            let mut tls = tokio::time::timeout(LOGIN_TIMEOUT, acceptor.accept(tcp))
                .await
                .map_err(|_| bad("TLS handshake timed out"))??;
            let p = tokio::time::timeout(LOGIN_TIMEOUT, packet(&mut tls))
                .await
                .map_err(|_| bad("login timed out"))??;
            login(&mut tls, p, door).await
        }
        (None, true) => {
            tcp.write_all(b"N").await?;
            let p = packet(&mut tcp).await?;
            login(&mut tcp, p, door).await
        }
        (_, false) => {
            // Without TLS only a cancel request passes when the worker has TLS.
            let cancel = matches!(
                parse_startup(&first[4..]),
                Ok(StartupPacket::CancelRequest { .. })
            );
            if door.tls.is_some() && !cancel {
                let m = messages::error_response(Severity::Fatal, "28000", "TLS is required");
                tcp.write_all(&m).await?;
                return Ok(());
            }
            login(&mut tcp, first, door).await
        }
    }
}

/// The startup packet `p` (length included) on `s`: a cancel is relayed, a startup must name
/// the fork's role and give its password.
async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    p: Vec<u8>,
    door: &Door,
) -> std::io::Result<()> {
    let refuse = |msg: &str| messages::error_response(Severity::Fatal, "28P01", msg);
    match parse_startup(&p[4..]) {
        Ok(StartupPacket::CancelRequest { .. }) => {
            let mut unix = UnixStream::connect(&door.socket).await?;
            unix.write_all(&p).await?;
            return Ok(());
        }
        Ok(StartupPacket::Startup(m)) if m.get("user") == Some(door.user.as_str()) => {}
        _ => {
            s.write_all(&refuse("this scratch server takes its own role only"))
                .await?;
            return Ok(());
        }
    }
    s.write_all(&messages::auth_cleartext()).await?;
    s.flush().await?;
    let given = tokio::time::timeout(LOGIN_TIMEOUT, password(s))
        .await
        .map_err(|_| bad("login timed out"))??;
    if !bool::from(given.as_slice().ct_eq(door.password.as_bytes())) {
        s.write_all(&refuse("password authentication failed"))
            .await?;
        return Ok(());
    }
    let mut unix = UnixStream::connect(&door.socket).await?;
    unix.write_all(&p).await?;
    tokio::io::copy_bidirectional(s, &mut unix).await?;
    Ok(())
}

/// A PasswordMessage's password (without its NUL).
async fn password<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head).await?;
    let n = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if head[0] != b'p' || !(5..=MAX_PASSWORD).contains(&n) {
        return Err(bad("expected a password message"));
    }
    let mut body = vec![0u8; n - 4];
    s.read_exact(&mut body).await?;
    if body.last() == Some(&0) {
        body.pop();
    }
    Ok(body)
}
