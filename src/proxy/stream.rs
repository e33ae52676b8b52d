//! A client connection, plain or TLS, behind one type.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::wire::socket::{self, LeanRead, LeanWrite};

/// A client socket after SSL negotiation.
pub enum ClientStream {
    /// No TLS.
    Plain(TcpStream),
    /// TLS (boxed: the TLS state is large and most of a session's life is spent elsewhere).
    Tls(Box<TlsStream<TcpStream>>),
}

impl ClientStream {
    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }
}

/// Read half of a client connection.
pub enum ClientRead {
    /// No TLS: registered for reading only, no lock shared with the write half.
    Plain(LeanRead<std::net::TcpStream>),
    /// TLS (one state for both directions, so tokio's locked split).
    Tls(tokio::io::ReadHalf<ClientStream>),
}

/// Write half of a client connection.
pub enum ClientWrite {
    /// No TLS: written directly, asking for write readiness only while a write would block.
    Plain(LeanWrite<std::net::TcpStream>),
    /// TLS.
    Tls(tokio::io::WriteHalf<ClientStream>),
}

impl ClientStream {
    /// Splits for the relay. A plain socket is re-registered for read readiness only (see
    /// [`crate::wire::socket`]): no wake-up each time the client's kernel acknowledges data.
    pub fn into_split(self) -> io::Result<(ClientRead, ClientWrite)> {
        Ok(match self {
            ClientStream::Plain(s) => {
                let (r, w) = socket::split_tcp(s)?;
                (ClientRead::Plain(r), ClientWrite::Plain(w))
            }
            tls => {
                let (r, w) = tokio::io::split(tls);
                (ClientRead::Tls(r), ClientWrite::Tls(w))
            }
        })
    }
}

impl ClientWrite {
    /// A write right now without a task context, where the socket allows it (plain TCP):
    /// None for TLS, whose writes go through the relay's event loop.
    pub fn try_send_now(&self, src: &[u8]) -> Option<io::Result<usize>> {
        match self {
            ClientWrite::Plain(w) => Some(w.try_send(src)),
            ClientWrite::Tls(_) => None,
        }
    }
}

/// `AsyncRead` / `AsyncWrite` for an enum whose variants `Plain` and `Tls` both are.
macro_rules! by_variant {
    ($self:expr, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Self::Plain($s) => $e,
            Self::Tls($s) => $e,
        }
    };
}

macro_rules! async_read {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                by_variant!(self, s => Pin::new(s).poll_read(cx, buf))
            }
        }
    };
}

macro_rules! async_write {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                by_variant!(self, s => Pin::new(s).poll_write(cx, buf))
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                by_variant!(self, s => Pin::new(s).poll_flush(cx))
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                by_variant!(self, s => Pin::new(s).poll_shutdown(cx))
            }
        }
    };
}

async_read!(ClientStream);
async_write!(ClientStream);
async_read!(ClientRead);
async_write!(ClientWrite);
