//! The socket to a backend: a unix socket (the `instance` provider, no extra cost), plain TCP,
//! or TCP with TLS negotiated by an SSLRequest (the `template` and `remote` providers).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{tcp, TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::{tls, BackendAddr, Endpoint};
use crate::wire::socket::{self, LeanRead, LeanWrite};
use crate::wire::startup::SSL_REQUEST;

/// Bound on reaching a TCP backend (connect + TLS handshake), so a black-holed address costs
/// the client a clear error instead of a hang.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected backend socket.
pub enum BackendStream {
    /// Unix socket.
    Unix(UnixStream),
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP (boxed: the TLS state is large).
    Tls(Box<TlsStream<TcpStream>>),
}

/// Connects to `ep`; for TLS endpoints sends an SSLRequest and runs the handshake.
pub async fn open(ep: &Endpoint) -> io::Result<BackendStream> {
    let (host, port) = match &ep.addr {
        BackendAddr::Unix(path) => {
            return Ok(BackendStream::Unix(UnixStream::connect(path).await?))
        }
        BackendAddr::Tcp { host, port } => (host.as_str(), *port),
    };
    let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "backend connect timed out");
    tokio::time::timeout(CONNECT_TIMEOUT, async {
        let mut sock = TcpStream::connect((host, port)).await?;
        let _ = sock.set_nodelay(true);
        let Some(t) = &ep.tls else {
            return Ok(BackendStream::Tcp(sock));
        };
        let mut req = [0u8; 8];
        req[..4].copy_from_slice(&8i32.to_be_bytes());
        req[4..].copy_from_slice(&SSL_REQUEST.to_be_bytes());
        sock.write_all(&req).await?;
        let mut answer = [0u8; 1];
        sock.read_exact(&mut answer).await?;
        if answer[0] != b'S' {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "backend does not offer TLS, and TLS is required",
            ));
        }
        let name = tls::server_name(&t.server_name)?;
        let s = TlsConnector::from(t.config.clone())
            .connect(name, sock)
            .await?;
        Ok(BackendStream::Tls(Box::new(s)))
    })
    .await
    .map_err(|_| timed_out())?
}

/// Read half of a backend socket.
pub enum BackendRead {
    /// Unix socket, registered for reading only (see [`crate::wire::socket`]).
    Unix(LeanRead<std::os::unix::net::UnixStream>),
    /// Plain TCP.
    Tcp(tcp::OwnedReadHalf),
    /// TLS.
    Tls(tokio::io::ReadHalf<Box<TlsStream<TcpStream>>>),
}

/// Write half of a backend socket.
pub enum BackendWrite {
    /// Unix socket, written directly (see [`crate::wire::socket`]).
    Unix(LeanWrite<std::os::unix::net::UnixStream>),
    /// Plain TCP.
    Tcp(tcp::OwnedWriteHalf),
    /// TLS.
    Tls(tokio::io::WriteHalf<Box<TlsStream<TcpStream>>>),
}

impl BackendStream {
    /// Splits into halves that can be used from two places at once; sockets split without a
    /// lock, TLS (one state for both directions) through tokio's split. A unix socket is
    /// re-registered for read readiness only: the relay's writes to the backend then cost
    /// no wake-up when the backend reads them.
    pub fn into_split(self) -> io::Result<(BackendRead, BackendWrite)> {
        Ok(match self {
            BackendStream::Unix(s) => {
                let (r, w) = socket::split_unix(s)?;
                (BackendRead::Unix(r), BackendWrite::Unix(w))
            }
            BackendStream::Tcp(s) => {
                let (r, w) = s.into_split();
                (BackendRead::Tcp(r), BackendWrite::Tcp(w))
            }
            BackendStream::Tls(s) => {
                let (r, w) = tokio::io::split(s);
                (BackendRead::Tls(r), BackendWrite::Tls(w))
            }
        })
    }
}

macro_rules! dispatch {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            Self::Unix($s) => $e,
            Self::Tcp($s) => $e,
            Self::Tls($s) => $e,
        }
    };
}

impl AsyncRead for BackendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}

impl AsyncRead for BackendRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl BackendWrite {
    /// A write right now without a task context, where the socket allows it (a unix socket):
    /// None for the others, which go through the relay's event loop.
    pub fn try_send_now(&self, src: &[u8]) -> Option<io::Result<usize>> {
        match self {
            BackendWrite::Unix(w) => Some(w.try_send(src)),
            _ => None,
        }
    }
}

impl AsyncWrite for BackendWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        dispatch!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}
