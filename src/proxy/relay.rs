//! The relay loop: client ⇄ backend through the session's `Pipeline`. Reads and writes of
//! both sides run concurrently (cancel-safe reads and writes in one `select!`), with
//! bounded buffers in each direction, so a large pipeline can never deadlock the gateway
//! against the backend and a slow client only slows its own session.

use bytes::{Buf, BytesMut};
use metrics::Counter;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use super::gate::Gate;
use super::pipeline::Pipeline;
use super::turn::Turn;
use crate::lifecycle::EndReason;
use crate::wire::frame::{FrameError, FrameReader};
use crate::wire::messages::{self, Severity};

/// Pause reading a side while this much is waiting to be written to the other.
const HIGH_WATER: usize = 256 * 1024;
/// Frames handled per wake-up before yielding to the other direction.
const BATCH: usize = 128;

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

/// Relay until either side leaves or the token ends.
pub async fn run(
    client: FrameReader<super::stream::ClientStream>,
    backend: FrameReader<crate::pgconn::stream::BackendStream>,
    mut ended: watch::Receiver<Option<EndReason>>,
    secrets: &[String],
    mut pl: Pipeline,
    watchdog: Option<Watchdog>,
    slot: Option<&crate::lifecycle::SessionSlot>,
) {
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
            return;
        }
    };
    let mut b_reader = FrameReader::with_buffer(b_read, b_buf, b_max);
    let (c_read, mut c_write) = match c_stream.into_split() {
        Ok(halves) => halves,
        Err(e) => {
            // The client socket could not be re-registered: nothing can reach it any more.
            tracing::warn!(error = %e, "client socket could not be registered");
            let _ = b_write.write_all(&[b'X', 0, 0, 0, 4]).await;
            return;
        }
    };
    let mut c_reader = FrameReader::with_buffer(c_read, c_buf, c_max);

    // Looked up once: a labelled lookup per write hashes and allocates its key.
    let bytes_up = metrics::counter!("sandpit_bytes_total", "direction" => "client_to_backend");
    let bytes_down = metrics::counter!("sandpit_bytes_total", "direction" => "backend_to_client");
    // Write buffers grow on first use: an idle session's small exchanges need a few hundred
    // bytes, not 16 KiB each (memory per idle session).
    let mut to_backend = BytesMut::new();
    let mut to_client = BytesMut::new();
    let mut terminated = false;
    let mut watching = true;
    // Requests (Query, Sync, FunctionCall) not yet answered by ReadyForQuery, and since when
    // the oldest unanswered work has been waiting.
    let mut unanswered: u64 = 0;
    let mut busy_since: Option<tokio::time::Instant> = None;
    let mut cancelled = false;
    // The backend said why it is ending the session: the client gets exactly that.
    let mut backend_said_fatal = false;

    // One timer for the session's life, moved only when it fires early: arming and dropping
    // a timer per request costs more than the rest of a small round trip's bookkeeping.
    // Gated (as is the token's end below): polled only when it fired or was moved.
    let mut timer = Gate::new(tokio::time::sleep(std::time::Duration::ZERO));
    let mut timer_armed = false;
    // One waiter on the token's end for the session's life (a `changed()` made per loop
    // would register and unregister a waiter each time).
    let mut end_rx = ended.clone();
    let mut token_ended = Gate::new(async move {
        loop {
            if let Some(r) = *end_rx.borrow_and_update() {
                return Some(r);
            }
            if end_rx.changed().await.is_err() {
                return None;
            }
        }
    });

    let mut turn = Turn::new(slot);

    let ending = 'relay: loop {
        if turn.over() {
            // Bounded work per wake-up: other sessions' turn (see `turn`).
            tokio::task::yield_now().await;
        }
        pl.drain_outbox(&mut to_backend);
        // Fast path: bytes just produced go out now when the socket takes them (unix and
        // plain TCP); what does not fit waits for the event loop below.
        if !to_backend.is_empty()
            && !sent_now(
                b_write.try_send_now(&to_backend),
                &mut to_backend,
                &bytes_up,
            )
        {
            break Ending::BackendGone;
        }
        if !to_client.is_empty()
            && !sent_now(
                c_write.try_send_now(&to_client),
                &mut to_client,
                &bytes_down,
            )
        {
            break Ending::ClientGone;
        }
        if terminated && to_backend.is_empty() && pl.outbox_empty() {
            break Ending::ClientTerminated;
        }
        // The token's end goes before any more reading (one atomic load when nothing changed;
        // the waiter below only wakes an idle session).
        if ended.has_changed().unwrap_or(false) {
            if let Some(r) = *ended.borrow_and_update() {
                break Ending::Ended(r);
            }
        }
        let read_client = !terminated && pl.accepting() && to_backend.len() < HIGH_WATER;
        let read_backend = to_client.len() < HIGH_WATER;
        let deadline = match (&watchdog, busy_since) {
            (Some(w), Some(t)) if !cancelled => Some(t + w.limit),
            _ => None,
        };
        // Armed no later than the deadline; a later deadline (the next request's) is left to
        // the firing below, which moves the timer on.
        if let Some(d) = deadline {
            if !timer_armed || timer.inner().deadline() > d {
                timer.inner().reset(d);
                timer.rearm();
                timer_armed = true;
            }
        }
        tokio::select! {
            _ = timer.wait(), if timer_armed => {
                timer_armed = false;
                match deadline {
                    // Fired for an earlier request: wait on for this one's deadline.
                    Some(d) if tokio::time::Instant::now() < d => {
                        timer.inner().reset(d);
                        timer.rearm();
                        timer_armed = true;
                    }
                    None => {}
                    Some(_) => if let Some(w) = &watchdog {
                        cancelled = true;
                        metrics::counter!("sandpit_statement_timeouts_total").increment(1);
                        tracing::info!(limit_ms = w.limit.as_millis() as u64, "statement timeout: cancelling");
                        let msg = format!(
                            "sandpit: the request ran longer than this token's statement_timeout ({} ms); cancelling it",
                            w.limit.as_millis()
                        );
                        to_client.extend_from_slice(&messages::notice_response("WARNING", "57014", &msg));
                        if let Err(e) = super::cancel::send(&w.target).await {
                            tracing::warn!(error = %e, "statement timeout cancel failed");
                        }
                    },
                }
            }
            r = token_ended.wait(), if watching => match r {
                Some(reason) => break Ending::Ended(reason),
                None => watching = false,
            },
            f = c_reader.read_frame(), if read_client => match f {
                Ok(Some(f)) => {
                    terminated = f.tag == b'X';
                    note_client(f.tag, &mut unanswered, &mut busy_since);
                    pl.on_client(f);
                    let mut n = 1;
                    let limit = BATCH.min(turn.room());
                    while !terminated && n < limit {
                        match c_reader.try_frame() {
                            Ok(Some(f)) => {
                                terminated = f.tag == b'X';
                                note_client(f.tag, &mut unanswered, &mut busy_since);
                                pl.on_client(f);
                                n += 1;
                            }
                            Ok(None) => break,
                            Err(e) => break 'relay Ending::ClientProtocol(e),
                        }
                    }
                    turn.spend(n);
                }
                Ok(None) | Err(FrameError::Io(_)) | Err(FrameError::Truncated) => break Ending::ClientGone,
                Err(e) => break Ending::ClientProtocol(e),
            },
            f = b_reader.read_frame(), if read_backend => match f {
                Ok(Some(f)) => {
                    note_backend(f.tag, &mut unanswered, &mut busy_since, &mut cancelled);
                    backend_said_fatal |= f.tag == b'E' && messages::is_fatal(f.body());
                    pl.on_backend(f, &mut to_client, secrets);
                    // Syncs sent inside COPY FROM STDIN are never answered.
                    unanswered = unanswered.saturating_sub(pl.take_ignored_syncs());
                    let mut n = 1;
                    let limit = BATCH.min(turn.room());
                    while n < limit && to_client.len() < HIGH_WATER {
                        match b_reader.try_frame() {
                            Ok(Some(f)) => {
                                note_backend(f.tag, &mut unanswered, &mut busy_since, &mut cancelled);
                                backend_said_fatal |= f.tag == b'E' && messages::is_fatal(f.body());
                                pl.on_backend(f, &mut to_client, secrets);
                                n += 1;
                            }
                            Ok(None) => break,
                            Err(e) => break 'relay Ending::BackendProtocol(e),
                        }
                    }
                    turn.spend(n);
                }
                Ok(None) | Err(FrameError::Io(_)) | Err(FrameError::Truncated) => break Ending::BackendGone,
                Err(e) => break Ending::BackendProtocol(e),
            },
            w = b_write.write(&to_backend), if !to_backend.is_empty() => match w {
                Ok(0) | Err(_) => break Ending::BackendGone,
                Ok(n) => {
                    bytes_up.increment(n as u64);
                    to_backend.advance(n);
                }
            },
            w = c_write.write(&to_client), if !to_client.is_empty() => match w {
                Ok(0) | Err(_) => break Ending::ClientGone,
                Ok(n) => {
                    bytes_down.increment(n as u64);
                    to_client.advance(n);
                    if to_client.is_empty() && c_write.flush().await.is_err() {
                        break Ending::ClientGone;
                    }
                }
            },
        }
    };

    tracing::debug!(?ending, "relay finished");
    // Before the client can see the session end, its outcomes are in the log (an idle
    // session's are written by the log's ticker: `journal::log::SyncTicker`).
    pl.flush_outcomes();
    let fatal = |code: &str, msg: &str| messages::error_response(Severity::Fatal, code, msg);
    let last = match &ending {
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
        Ending::BackendGone => Some(fatal("08006", "the scratch database closed the connection")),
        Ending::ClientGone | Ending::ClientTerminated => None,
    };
    // What the client was already owed goes first (unless the token ended), then the reason
    // for the end.
    if !matches!(ending, Ending::Ended(_) | Ending::ClientGone) {
        let _ = c_write.write_all(&to_client).await;
    }
    if let Some(m) = last {
        let _ = c_write.write_all(&m).await;
    }
    if !matches!(ending, Ending::ClientTerminated) {
        // Let the backend session end cleanly rather than on a broken pipe.
        let _ = b_write.write_all(&[b'X', 0, 0, 0, 4]).await;
    }
    let _ = c_write.flush().await;
    let _ = c_write.shutdown().await;
    let _ = b_write.shutdown().await;
}

/// Accounts for a `try_send_now` of `buf`: what went out is counted and dropped from it.
/// False when the peer is gone; a full socket or a stream without the fast path (None) is
/// left to the event loop.
fn sent_now(r: Option<std::io::Result<usize>>, buf: &mut BytesMut, counter: &Counter) -> bool {
    match r {
        Some(Ok(0)) => false,
        Some(Ok(n)) => {
            counter.increment(n as u64);
            buf.advance(n);
            true
        }
        Some(Err(e)) => e.kind() == std::io::ErrorKind::WouldBlock,
        None => true,
    }
}

/// A client message starts the clock if nothing was running; Query, Sync and FunctionCall
/// each owe one ReadyForQuery.
fn note_client(tag: u8, unanswered: &mut u64, busy_since: &mut Option<tokio::time::Instant>) {
    if matches!(tag, b'X' | b'd' | b'c' | b'f') {
        return; // Terminate and COPY data are not requests
    }
    if matches!(tag, b'Q' | b'S' | b'F') {
        *unanswered += 1;
    }
    busy_since.get_or_insert_with(tokio::time::Instant::now);
}

/// ReadyForQuery answers one request; the clock restarts for the next one, if any.
fn note_backend(
    tag: u8,
    unanswered: &mut u64,
    busy_since: &mut Option<tokio::time::Instant>,
    cancelled: &mut bool,
) {
    if tag != b'Z' {
        return;
    }
    *unanswered = unanswered.saturating_sub(1);
    *cancelled = false;
    *busy_since = (*unanswered > 0).then(tokio::time::Instant::now);
}
