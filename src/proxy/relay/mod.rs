//! The relay loop: client ⇄ backend through the session's `Pipeline`. Reads and writes of
//! both sides run concurrently (cancel-safe reads and writes in one `select!`), with
//! bounded buffers in each direction, so a large pipeline can never deadlock the gateway
//! against the backend and a slow client only slows its own session.

mod clock;

use std::convert::Infallible;
use std::future::poll_fn;

use bytes::{Buf, Bytes, BytesMut};
use metrics::Counter;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::gate::{Gate, Latch};
use super::pipeline::Pipeline;
use super::stream::{ClientRead, ClientStream, ClientWrite};
use super::turn::Turn;
use crate::lifecycle::{EndReason, SessionSlot};
use crate::pgconn::stream::{BackendRead, BackendStream, BackendWrite};
use crate::wire::frame::{Frame, FrameError, FrameReader};
use crate::wire::messages::{self, Severity};
use clock::{Alarm, Fired, StatementClock};

/// Pause reading a side while this much is waiting to be written to the other.
const HIGH_WATER: usize = 256 * 1024;
/// Frames handled per wake-up before yielding to the other direction.
const BATCH: usize = 128;
/// Terminate, sent to the backend so its session ends cleanly rather than on a broken pipe.
const TERMINATE: [u8; 5] = [b'X', 0, 0, 0, 4];

/// The gateway's own statement timeout: the backend is sent a CancelRequest when a request
/// has waited this long for its ReadyForQuery. It does not depend on the session's
/// `statement_timeout`, which the agent may change.
pub struct Watchdog {
    /// How long a request may run.
    pub limit: std::time::Duration,
    /// Where the cancel goes.
    pub target: super::cancel::CancelTarget,
}

/// Why a relay ended.
#[derive(Debug)]
enum Ending {
    ClientGone,
    ClientTerminated,
    BackendGone,
    Ended(EndReason),
    ClientProtocol(FrameError),
    BackendProtocol(FrameError),
}

/// What the relay needs of its session besides the two connections and the pipeline.
pub struct Context<'a> {
    /// The token's end, as it happens.
    pub ended: watch::Receiver<Option<EndReason>>,
    /// Backend details scrubbed from what the client is shown.
    pub secrets: &'a [String],
    /// The gateway's own statement timeout, if the token has one.
    pub watchdog: Option<Watchdog>,
    /// The session's slot, for its fair turns (see `turn`).
    pub slot: Option<&'a SessionSlot>,
    /// The session's span: entered around the relay's events only.
    pub span: &'a tracing::Span,
}

/// Relay until either side leaves or the token ends. The pipeline comes boxed because an
/// async fn keeps its arguments in its state for its whole life: moved into the relay, it
/// would otherwise be held twice by every session.
pub async fn run(
    client: FrameReader<ClientStream>,
    backend: FrameReader<BackendStream>,
    pl: Box<Pipeline>,
    cx: Context<'_>,
) {
    let Context {
        ended,
        secrets,
        watchdog,
        slot,
        span,
    } = cx;
    let Some(sides) = Sides::split(client, backend).instrument(span.clone()).await else {
        return;
    };
    let mut relay = Relay {
        sides,
        flow: Flow::new(*pl, secrets, watchdog.as_ref().map(|w| w.limit)),
        turn: Turn::new(slot),
        alarm: Alarm::new(),
        watchdog,
        span,
    };
    let Err(ending) = relay.pump(ended).await;
    let _in = span.enter();
    tracing::debug!(?ending, "relay finished");
    // Said here, in the span (see `Relay::span`); `close` itself logs nothing.
    let last = ending.last_word(relay.flow.backend_said_fatal);
    drop(_in);
    // Closing's state (a last write each way, the log's end) is larger than the pump's; on
    // the heap, it does not size every idle session's task.
    Box::pin(relay.close(ending, last)).await;
}

/// Both connections, each split into its framed read half and its write half; each read
/// half behind a latch, so a read that found nothing waits for its socket's signal.
struct Sides {
    c_reader: FrameReader<ClientRead>,
    c_latch: Latch,
    c_write: ClientWrite,
    b_reader: FrameReader<BackendRead>,
    b_latch: Latch,
    b_write: BackendWrite,
}

impl Sides {
    /// Splits both streams, keeping what their readers had buffered. None when a socket
    /// could not be registered (the other side has been told).
    async fn split(
        client: FrameReader<ClientStream>,
        backend: FrameReader<BackendStream>,
    ) -> Option<Sides> {
        let (mut c_stream, c_buf, c_max) = client.into_parts();
        let (b_stream, b_buf, b_max) = backend.into_parts();
        let (b_read, mut b_write) = match b_stream.into_split() {
            Ok(halves) => halves,
            Err(e) => {
                tracing::warn!(error = %e, "backend socket could not be registered");
                let msg = "lost the connection to the scratch database";
                let _ = c_stream
                    .write_all(&messages::error_response(Severity::Fatal, "08006", msg))
                    .await;
                return None;
            }
        };
        let (c_read, c_write) = match c_stream.into_split() {
            Ok(halves) => halves,
            Err(e) => {
                // The client socket could not be re-registered: nothing can reach it any more.
                tracing::warn!(error = %e, "client socket could not be registered");
                let _ = b_write.write_all(&TERMINATE).await;
                return None;
            }
        };
        Some(Sides {
            c_reader: FrameReader::with_buffer(c_read, c_buf, c_max),
            c_latch: Latch::new(),
            c_write,
            b_reader: FrameReader::with_buffer(b_read, b_buf, b_max),
            b_latch: Latch::new(),
            b_write,
        })
    }
}

/// Bytes waiting to be written to one side, and the counter of what went out to it.
struct Outgoing {
    buf: BytesMut,
    counter: Counter,
}

impl Outgoing {
    /// Write buffers grow on first use: an idle session's small exchanges need a few hundred
    /// bytes, not 16 KiB each (memory per idle session). The counter is looked up once: a
    /// labelled lookup per write hashes and allocates its key.
    fn new(direction: &'static str) -> Self {
        Outgoing {
            buf: BytesMut::new(),
            counter: metrics::counter!("sandpit_bytes_total", "direction" => direction),
        }
    }

    /// `n` bytes went out: counted and dropped.
    #[inline]
    fn went(&mut self, n: usize) {
        self.counter.increment(n as u64);
        self.buf.advance(n);
    }

    /// Accounts for a `try_send_now` of the buffer. False when the peer is gone; a full
    /// socket or a stream without the fast path (None) is left to the event loop.
    #[inline]
    fn sent_now(&mut self, r: Option<std::io::Result<usize>>) -> bool {
        match r {
            Some(Ok(0)) => false,
            Some(Ok(n)) => {
                self.went(n);
                true
            }
            Some(Err(e)) => e.kind() == std::io::ErrorKind::WouldBlock,
            None => true,
        }
    }

    /// Accounts for a write of the buffer. False when the peer is gone.
    #[inline]
    fn wrote(&mut self, r: std::io::Result<usize>) -> bool {
        match r {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.went(n);
                true
            }
        }
    }
}

/// What the frames change: the pipeline, the statement clock, the bytes owed each side,
/// and what the session's end must say.
struct Flow<'a> {
    pl: Pipeline,
    secrets: &'a [String],
    clock: StatementClock,
    to_backend: Outgoing,
    to_client: Outgoing,
    /// The client sent Terminate.
    terminated: bool,
    /// The backend said why it is ending the session: the client gets exactly that.
    backend_said_fatal: bool,
}

impl<'a> Flow<'a> {
    fn new(pl: Pipeline, secrets: &'a [String], limit: Option<std::time::Duration>) -> Self {
        Flow {
            pl,
            secrets,
            clock: StatementClock::new(limit),
            to_backend: Outgoing::new("client_to_backend"),
            to_client: Outgoing::new("backend_to_client"),
            terminated: false,
            backend_said_fatal: false,
        }
    }

    /// One client frame through the pipeline; whether another may follow in this batch.
    #[inline]
    fn client_frame(&mut self, f: Frame) -> bool {
        self.terminated = f.tag == b'X';
        self.clock.client_sent(f.tag, Instant::now);
        self.pl.on_client(f);
        !self.terminated
    }

    /// One backend frame through the pipeline; whether another may follow in this batch.
    #[inline]
    fn backend_frame(&mut self, f: Frame) -> bool {
        self.clock.backend_sent(f.tag, Instant::now);
        self.backend_said_fatal |= f.tag == b'E' && messages::is_fatal(f.body());
        self.pl.on_backend(f, &mut self.to_client.buf, self.secrets);
        self.to_client.buf.len() < HIGH_WATER
    }
}

/// A relaying session.
struct Relay<'a> {
    sides: Sides,
    flow: Flow<'a>,
    turn: Turn<'a>,
    /// The statement clock's timer.
    alarm: Alarm,
    watchdog: Option<Watchdog>,
    /// The session's span: entered around the relay's events only, not at every poll.
    span: &'a tracing::Span,
}

impl Relay<'_> {
    /// The loop: each wake-up sends what is ready, checks the token's end, sets the alarm to
    /// the statement clock's deadline, then handles whichever side moved first.
    async fn pump(
        &mut self,
        mut ended: watch::Receiver<Option<EndReason>>,
    ) -> Result<Infallible, Ending> {
        // One waiter on the token's end for the session's life (a `changed()` made per loop
        // would register and unregister a waiter each time); gated like the alarm: polled
        // only when it fired.
        let mut token_end = Gate::new(token_end(ended.clone()));
        let mut watching = true;
        loop {
            if self.turn.over() {
                // Bounded work per wake-up: other sessions' turn (see `turn`).
                tokio::task::yield_now().await;
            }
            self.send_ready()?;
            ended_now(&mut ended)?;
            let read_client = self.may_read_client();
            let read_backend = self.flow.to_client.buf.len() < HIGH_WATER;
            self.alarm.arm_by(self.flow.clock.deadline());
            let s = &mut self.sides;
            tokio::select! {
                _ = self.alarm.wait(), if self.alarm.armed() => self.on_alarm().await,
                r = token_end.wait(), if watching => match r {
                    Some(reason) => return Err(Ending::Ended(reason)),
                    None => watching = false,
                },
                f = poll_fn(|cx| s.c_latch.poll_source(cx, |cx| s.c_reader.poll_frame(cx))),
                    if read_client => self.client_woke(f)?,
                f = poll_fn(|cx| s.b_latch.poll_source(cx, |cx| s.b_reader.poll_frame(cx))),
                    if read_backend => self.backend_woke(f)?,
                w = s.b_write.write(&self.flow.to_backend.buf),
                    if !self.flow.to_backend.buf.is_empty() => self.wrote_to_backend(w)?,
                w = s.c_write.write(&self.flow.to_client.buf),
                    if !self.flow.to_client.buf.is_empty() => self.wrote_to_client(w).await?,
            }
        }
    }

    /// What the pipeline may send now goes to the backend's buffer; both buffers go out now
    /// when the socket takes them (unix and plain TCP); what does not fit waits for the
    /// event loop. A client that sent Terminate ends here once its last bytes are out.
    #[inline]
    fn send_ready(&mut self) -> Result<(), Ending> {
        let (s, f) = (&mut self.sides, &mut self.flow);
        f.pl.drain_outbox(&mut f.to_backend.buf);
        if !f.to_backend.buf.is_empty()
            && !f
                .to_backend
                .sent_now(s.b_write.try_send_now(&f.to_backend.buf))
        {
            return Err(Ending::BackendGone);
        }
        if !f.to_client.buf.is_empty()
            && !f
                .to_client
                .sent_now(s.c_write.try_send_now(&f.to_client.buf))
        {
            return Err(Ending::ClientGone);
        }
        if f.terminated && f.to_backend.buf.is_empty() && f.pl.outbox_empty() {
            return Err(Ending::ClientTerminated);
        }
        Ok(())
    }

    /// The client is read while it has not left, the pipeline takes more, and the backend
    /// is not behind.
    #[inline]
    fn may_read_client(&self) -> bool {
        let f = &self.flow;
        !f.terminated && f.pl.accepting() && f.to_backend.buf.len() < HIGH_WATER
    }

    /// The client's side woke with a frame: it and a batch of those already buffered.
    #[inline]
    fn client_woke(&mut self, read: Result<Option<Frame>, FrameError>) -> Result<(), Ending> {
        let first = match read {
            Ok(Some(f)) => f,
            Ok(None) | Err(FrameError::Io(_)) | Err(FrameError::Truncated) => {
                return Err(Ending::ClientGone)
            }
            Err(e) => return Err(Ending::ClientProtocol(e)),
        };
        let f = &mut self.flow;
        let more = f.client_frame(first);
        let limit = BATCH.min(self.turn.room());
        let n = batch(&mut self.sides.c_reader, more, limit, |frame| {
            f.client_frame(frame)
        })
        .map_err(Ending::ClientProtocol)?;
        self.turn.spend(n);
        Ok(())
    }

    /// The backend's side woke with a frame: it and a batch of those already buffered.
    #[inline]
    fn backend_woke(&mut self, read: Result<Option<Frame>, FrameError>) -> Result<(), Ending> {
        let first = match read {
            Ok(Some(f)) => f,
            Ok(None) | Err(FrameError::Io(_)) | Err(FrameError::Truncated) => {
                return Err(Ending::BackendGone)
            }
            Err(e) => return Err(Ending::BackendProtocol(e)),
        };
        let f = &mut self.flow;
        let more = f.backend_frame(first);
        // Syncs sent inside COPY FROM STDIN are never answered.
        f.clock.never_answered(f.pl.take_ignored_syncs());
        let limit = BATCH.min(self.turn.room());
        let n = batch(&mut self.sides.b_reader, more, limit, |frame| {
            f.backend_frame(frame)
        })
        .map_err(Ending::BackendProtocol)?;
        self.turn.spend(n);
        Ok(())
    }

    /// Accounts for a write to the backend.
    #[inline]
    fn wrote_to_backend(&mut self, w: std::io::Result<usize>) -> Result<(), Ending> {
        if self.flow.to_backend.wrote(w) {
            Ok(())
        } else {
            Err(Ending::BackendGone)
        }
    }

    /// Accounts for a write to the client; once all is out, it is flushed (TLS).
    async fn wrote_to_client(&mut self, w: std::io::Result<usize>) -> Result<(), Ending> {
        let out = &mut self.flow.to_client;
        if !out.wrote(w) || (out.buf.is_empty() && self.sides.c_write.flush().await.is_err()) {
            return Err(Ending::ClientGone);
        }
        Ok(())
    }

    /// The alarm went off: early for this request (set on), or its deadline passed: the
    /// client is warned and the backend sent a cancel.
    async fn on_alarm(&mut self) {
        self.alarm.went_off();
        match self.flow.clock.fired(Instant::now) {
            Fired::Idle => {}
            Fired::Early(d) => self.alarm.set(d),
            Fired::Overdue => {
                if let Some(w) = &self.watchdog {
                    metrics::counter!("sandpit_statement_timeouts_total").increment(1);
                    let ms = w.limit.as_millis();
                    self.span.in_scope(|| {
                        tracing::info!(limit_ms = ms as u64, "statement timeout: cancelling")
                    });
                    let msg = format!(
                        "sandpit: the request ran longer than this token's statement_timeout ({ms} ms); cancelling it"
                    );
                    self.flow
                        .to_client
                        .buf
                        .extend_from_slice(&messages::notice_response("WARNING", "57014", &msg));
                    let sent = super::cancel::send(&w.target)
                        .instrument(self.span.clone())
                        .await;
                    if let Err(e) = sent {
                        let _in = self.span.enter();
                        tracing::warn!(error = %e, "statement timeout cancel failed");
                    }
                }
            }
        }
    }

    /// The end: outcomes logged, what the client was owed and the reason sent, the
    /// backend's session ended, both sockets shut.
    async fn close(mut self, ending: Ending, last: Option<Bytes>) {
        // Before the client can see the session end, its outcomes are in the log (an idle
        // session's are written by the log's ticker: `journal::log::SyncTicker`).
        self.flow.pl.flush_outcomes();
        let s = &mut self.sides;
        // What the client was already owed goes first (unless the token ended), then the
        // reason for the end.
        if !matches!(ending, Ending::Ended(_) | Ending::ClientGone) {
            let _ = s.c_write.write_all(&self.flow.to_client.buf).await;
        }
        if let Some(m) = last {
            let _ = s.c_write.write_all(&m).await;
        }
        if !matches!(ending, Ending::ClientTerminated) {
            let _ = s.b_write.write_all(&TERMINATE).await;
        }
        let _ = s.c_write.flush().await;
        let _ = s.c_write.shutdown().await;
        let _ = s.b_write.shutdown().await;
    }
}

impl Ending {
    /// The FATAL the client is told last, if any.
    fn last_word(&self, backend_said_fatal: bool) -> Option<Bytes> {
        let fatal = |code: &str, msg: &str| messages::error_response(Severity::Fatal, code, msg);
        match self {
            Ending::Ended(reason) => Some(fatal("57P01", reason.message())),
            Ending::ClientProtocol(e) => {
                metrics::counter!("sandpit_protocol_violations_total", "kind" => "client_frame")
                    .increment(1);
                Some(fatal("08P01", &e.to_string()))
            }
            Ending::BackendProtocol(e) => {
                tracing::warn!(error = %e, "backend protocol error");
                Some(fatal(
                    "08006",
                    "lost the connection to the scratch database",
                ))
            }
            // Its own FATAL (termination, shutdown, idle timeout) already went to the client.
            Ending::BackendGone if backend_said_fatal => None,
            Ending::BackendGone => {
                Some(fatal("08006", "the scratch database closed the connection"))
            }
            Ending::ClientGone | Ending::ClientTerminated => None,
        }
    }
}

/// The frames after the one that woke a side: those already buffered, while `more` says
/// another may follow, up to `limit` in all (the first counted). How many were handled, or
/// the protocol error of a buffered frame.
#[inline]
fn batch<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    mut more: bool,
    limit: usize,
    mut handle: impl FnMut(Frame) -> bool,
) -> Result<usize, FrameError> {
    let mut n = 1;
    while more && n < limit {
        match reader.try_frame()? {
            Some(f) => {
                more = handle(f);
                n += 1;
            }
            None => break,
        }
    }
    Ok(n)
}

/// The token's end as it happens; None when its sender is gone (nothing more to watch).
async fn token_end(mut rx: watch::Receiver<Option<EndReason>>) -> Option<EndReason> {
    loop {
        if let Some(r) = *rx.borrow_and_update() {
            return Some(r);
        }
        if rx.changed().await.is_err() {
            return None;
        }
    }
}

/// The token's end goes before any more reading: one atomic load when nothing changed (the
/// waiter in the loop only wakes an idle session).
#[inline]
fn ended_now(ended: &mut watch::Receiver<Option<EndReason>>) -> Result<(), Ending> {
    if ended.has_changed().unwrap_or(false) {
        if let Some(r) = *ended.borrow_and_update() {
            return Err(Ending::Ended(r));
        }
    }
    Ok(())
}
