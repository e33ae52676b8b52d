//! Framing of regular (tagged) protocol messages: one type byte, an i32 length that counts
//! itself, then the body. Lengths are checked against a limit before anything is allocated.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

/// A framing failure. Any of these ends the connection it came from, and only that one.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer sent a length below 4 (impossible) — garbage on the wire.
    #[error("invalid message length {0}")]
    BadLength(i32),
    /// The peer announced a message larger than we accept.
    #[error("message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    /// The peer closed the connection in the middle of a message.
    #[error("connection closed in the middle of a message")]
    Truncated,
    /// Reading failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Capacity of a reader's buffer: one per direction per session, kept for its whole life.
pub const READ_BUF: usize = 16 * 1024;

/// One complete message: the tag and the whole raw frame (tag + length + body).
#[derive(Debug, Clone)]
pub struct Frame {
    /// Message type byte.
    pub tag: u8,
    /// The frame exactly as it was on the wire, tag included.
    pub raw: Bytes,
}

impl Frame {
    /// The body (after tag and length).
    pub fn body(&self) -> &[u8] {
        self.raw.get(5..).unwrap_or(&[])
    }
}

/// Reads whole frames from a stream through one reusable buffer.
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_len: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wrap a stream; `max_len` bounds any single message (including its header).
    pub fn new(inner: R, max_len: usize) -> Self {
        FrameReader {
            inner,
            buf: BytesMut::with_capacity(READ_BUF),
            max_len,
        }
    }

    /// Wrap a stream that already delivered `leftover` bytes, reading on into the same
    /// buffer: once no frame taken from it is alive, its whole capacity is reused (the
    /// unread bytes moved to its start) rather than a second buffer allocated.
    pub fn with_buffer(inner: R, leftover: BytesMut, max_len: usize) -> Self {
        let mut buf = leftover;
        buf.reserve(READ_BUF.saturating_sub(buf.len()));
        FrameReader {
            inner,
            buf,
            max_len,
        }
    }

    /// Change the per-message limit (small during auth, larger once authenticated).
    pub fn set_max_len(&mut self, max_len: usize) {
        self.max_len = max_len;
    }

    /// The underlying stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Take the stream, the bytes read but not yet framed, and the limit apart (to split a
    /// stream into halves without losing what was already read).
    pub fn into_parts(self) -> (R, BytesMut, usize) {
        (self.inner, self.buf, self.max_len)
    }

    /// Bytes that were read but not consumed as frames yet.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Take the next complete frame that is already buffered, without reading.
    pub fn try_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if len < 4 {
            return Err(FrameError::BadLength(len));
        }
        let total = len as usize + 1;
        if total > self.max_len {
            return Err(FrameError::TooLarge {
                len: total,
                limit: self.max_len,
            });
        }
        if self.buf.len() < total {
            // Reserve only what this (bounded) frame needs.
            self.buf.reserve(total - self.buf.len());
            return Ok(None);
        }
        let raw = self.buf.split_to(total).freeze();
        Ok(Some(Frame { tag: raw[0], raw }))
    }

    /// Read until at least one more frame is available. `Ok(None)` on a clean EOF between frames.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        std::future::poll_fn(|cx| self.poll_frame(cx)).await
    }

    /// [`FrameReader::read_frame`] as a poll: a buffered frame, or as many reads as it takes
    /// to complete one. `Pending` only when the stream was (and its waker is now with it).
    pub fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Frame>, FrameError>> {
        loop {
            if let Some(f) = self.try_frame()? {
                return Poll::Ready(Ok(Some(f)));
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameError::Truncated)
                });
            }
        }
    }

    /// One read into the buffer's spare room (at least 64 bytes of it); how many bytes came.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        let spare = self.buf.chunk_mut();
        // SAFETY: the slice is only handed to `ReadBuf`, which never de-initialises bytes
        // and reports how many it filled; only those are claimed below.
        let spare = unsafe { spare.as_uninit_slice_mut() };
        let mut rb = ReadBuf::uninit(spare);
        ready!(Pin::new(&mut self.inner).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: `ReadBuf` says these `n` bytes were initialised by the read.
        unsafe { self.buf.advance_mut(n) };
        Poll::Ready(Ok(n))
    }

    /// Drop buffered bytes (used when a connection is being torn down).
    pub fn clear(&mut self) {
        self.buf.advance(self.buf.len());
    }
}

/// Build a frame from a tag and body.
pub fn build(tag: u8, body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len() + 5);
    out.extend_from_slice(&[tag]);
    out.extend_from_slice(&((body.len() as i32 + 4).to_be_bytes()));
    out.extend_from_slice(body);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_split_across_reads_and_bounded() {
        let mut data = Vec::new();
        data.extend_from_slice(&build(b'Q', b"select 1\0"));
        data.extend_from_slice(&build(b'X', b""));
        let mut r = FrameReader::new(&data[..], 1024);
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(f.tag, b'Q');
        assert_eq!(f.body(), b"select 1\0");
        assert_eq!(r.read_frame().await.unwrap().unwrap().tag, b'X');
        assert!(r.read_frame().await.unwrap().is_none());

        let big = [b'Q', 0x7f, 0xff, 0xff, 0xff];
        let mut r = FrameReader::new(&big[..], 1024);
        assert!(matches!(
            r.read_frame().await,
            Err(FrameError::TooLarge { .. })
        ));
        let neg = [b'Q', 0, 0, 0, 1];
        let mut r = FrameReader::new(&neg[..], 1024);
        assert!(matches!(
            r.read_frame().await,
            Err(FrameError::BadLength(1))
        ));
        let trunc = [b'Q', 0, 0, 0, 9, b's'];
        let mut r = FrameReader::new(&trunc[..], 1024);
        assert!(matches!(r.read_frame().await, Err(FrameError::Truncated)));
    }
}
