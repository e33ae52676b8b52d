//! A relayed socket registered with the event loop for reading only.
//!
//! tokio registers every socket for readable *and* writable readiness (edge-triggered), so
//! each time the peer drains what the gateway sent, the kernel reports a write-space edge and
//! the worker thread wakes from `epoll_wait` for nothing: one wasted syscall per round trip
//! on a unix socket to the backend. PgBouncer asks for write readiness only while a write
//! would block; so does this: writes go straight to the socket, and only a write that would
//! block registers (a duplicate of) the descriptor for write readiness, until it went
//! through.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// The read half of a socket split by [`split`].
pub struct LeanRead<S: AsRawFd> {
    io: Arc<AsyncFd<S>>,
}

/// The write half of a socket split by [`split`].
pub struct LeanWrite<S: AsRawFd> {
    io: Arc<AsyncFd<S>>,
    /// Registered for write readiness only while a write would block.
    blocked: Option<AsyncFd<OwnedFd>>,
}

/// Registers `inner` with the runtime's event loop for `interest` only. Private: its callers
/// pass only owning descriptor types (std sockets, `OwnedFd`), which keeps the safety
/// contract below.
fn register<T: AsRawFd>(inner: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: every `T` used here owns its descriptor: it stays open, refers to the same
    // socket and is what `as_raw_fd` returns until the `AsyncFd` is dropped.
    unsafe { AsyncFd::register_with_interest(inner, interest) }.map_err(|e| e.into_parts().1)
}

/// Registers a non-blocking socket for read readiness and splits it into halves that need
/// no lock between them.
fn split<S: AsRawFd + AsFd>(sock: S) -> io::Result<(LeanRead<S>, LeanWrite<S>)> {
    let io = Arc::new(register(sock, Interest::READABLE)?);
    Ok((LeanRead { io: io.clone() }, LeanWrite { io, blocked: None }))
}

/// Converts a tokio unix socket (deregistering it from tokio's own registration).
pub fn split_unix(
    s: tokio::net::UnixStream,
) -> io::Result<(
    LeanRead<std::os::unix::net::UnixStream>,
    LeanWrite<std::os::unix::net::UnixStream>,
)> {
    let std = s.into_std()?;
    std.set_nonblocking(true)?;
    split(std)
}

/// Converts a tokio TCP socket (deregistering it from tokio's own registration).
pub fn split_tcp(
    s: tokio::net::TcpStream,
) -> io::Result<(
    LeanRead<std::net::TcpStream>,
    LeanWrite<std::net::TcpStream>,
)> {
    let std = s.into_std()?;
    std.set_nonblocking(true)?;
    split(std)
}

fn recv(fd: i32, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
    // SAFETY: nothing uninitialised is read; recv only writes into `dst`, which is valid for
    // `dst.len()` bytes, and only what it reports is assumed initialised below.
    let n = unsafe {
        let dst = buf.unfilled_mut();
        libc::recv(fd, dst.as_mut_ptr().cast(), dst.len(), 0)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel wrote `n` bytes into the unfilled part.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Ok(n)
}

fn send(fd: i32, src: &[u8]) -> io::Result<usize> {
    // SAFETY: `src` is valid for `src.len()` bytes of reads. MSG_NOSIGNAL: a vanished peer is
    // an error here, never a SIGPIPE.
    let n = unsafe { libc::send(fd, src.as_ptr().cast(), src.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl<S: AsRawFd> AsyncRead for LeanRead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let want = buf.remaining();
        loop {
            let mut guard = ready!(self.io.poll_read_ready(cx))?;
            match guard.try_io(|io| recv(io.as_raw_fd(), buf)) {
                Ok(Ok(n)) => {
                    // A short read means the socket is drained: forget the readiness now
                    // (as tokio's own sockets do) rather than pay a recv that says EAGAIN.
                    if n > 0 && n < want {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl<S: AsRawFd> LeanWrite<S> {
    /// Writes what the socket takes now, without a task context: the relay's fast path right
    /// after it produced bytes (one `send`, no trip through its event loop). `WouldBlock`
    /// when the socket is full or an earlier write is waiting for room.
    pub fn try_send(&self, src: &[u8]) -> io::Result<usize> {
        if self.blocked.is_some() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        loop {
            match send(self.io.as_raw_fd(), src) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }
}

impl<S: AsRawFd + AsFd> AsyncWrite for LeanWrite<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        src: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if let Some(blocked) = &this.blocked {
                let mut guard = ready!(blocked.poll_write_ready(cx))?;
                match send(this.io.as_raw_fd(), src) {
                    Ok(n) => {
                        drop(guard);
                        // Writable again: stop asking, so the peer's reads wake no one.
                        this.blocked = None;
                        return Poll::Ready(Ok(n));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        guard.clear_ready();
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            match send(this.io.as_raw_fd(), src) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Registered on a duplicate: the original is registered for reading,
                    // and one descriptor cannot be registered twice.
                    let dup = this.io.get_ref().as_fd().try_clone_to_owned()?;
                    this.blocked = Some(register(dup, Interest::WRITABLE)?);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: a plain syscall on a descriptor this half keeps open.
        let r = unsafe { libc::shutdown(self.io.as_raw_fd(), libc::SHUT_WR) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOTCONN) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn relays_both_ways_and_survives_a_full_send_buffer() {
        let (a, b) = tokio::net::UnixStream::pair().expect("pair");
        let (mut r, mut w) = split_unix(a).expect("split");
        let (mut br, mut bw) = b.into_split();
        // Far more than a unix socket buffers: the write must block and resume.
        let big = vec![7u8; 8 * 1024 * 1024];
        let expect = big.len();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            while got.len() < expect {
                let n = br.read(&mut buf).await.expect("read");
                assert!(n > 0, "eof after {}", got.len());
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        w.write_all(&big).await.expect("write_all");
        let got = reader.await.expect("join");
        assert_eq!(got.len(), expect);
        assert!(got.iter().all(|b| *b == 7));
        // And the other way, ending with EOF after the peer shuts down.
        bw.write_all(b"hello").await.expect("write");
        bw.shutdown().await.expect("shutdown");
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.expect("read_to_end");
        assert_eq!(back, b"hello");
        w.shutdown().await.expect("our shutdown");
    }

    #[tokio::test]
    async fn try_send_writes_now_until_the_socket_is_full() {
        let (a, b) = tokio::net::UnixStream::pair().expect("pair");
        let (_r, mut w) = split_unix(a).expect("split");
        assert_eq!(w.try_send(b"abc").expect("room"), 3);
        // Fill the socket: try_send then says WouldBlock instead of waiting.
        let chunk = vec![1u8; 64 * 1024];
        let mut sent = 3usize;
        let full = loop {
            match w.try_send(&chunk) {
                Ok(n) => sent += n,
                Err(e) => break e,
            }
            assert!(sent < 64 * 1024 * 1024, "a unix socket never filled");
        };
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock);
        // The async path still completes once the peer reads.
        let reader = tokio::spawn(async move {
            let mut b = b;
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = 0usize;
            while got < sent + 1 {
                got += b.read(&mut buf).await.expect("read");
            }
            got
        });
        w.write_all(b"z").await.expect("write after full");
        assert_eq!(reader.await.expect("join"), sent + 1);
    }

    #[tokio::test]
    async fn a_vanished_peer_is_an_error_not_a_signal() {
        let (a, b) = tokio::net::UnixStream::pair().expect("pair");
        let (_r, mut w) = split_unix(a).expect("split");
        drop(b);
        let e = w.write_all(b"x").await.expect_err("peer gone");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
