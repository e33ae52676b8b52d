//! One client connection, as steps: negotiate (SSL, cancel) → admit (refusals that do not
//! depend on the token) → authenticate → attach the backend → relay. Every refusal on the
//! way is a [`SessionError`], reported at one exit.

mod connect;
mod error;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::Instrument;

pub use error::SessionError;

use connect::{backend_params, connect_with_retry, pace, token_timeouts, Phases};

use super::auth_flow::{authenticate, over_limit};
use super::cancel::{CancelKey, CancelTarget};
use super::caps::CapPolicy;
use super::pipeline::{Pipeline, SessionIdentity};
use super::relay;
use super::stream::ClientStream;
use super::Proxy;
use crate::journal::log::TokenLog;
use crate::lifecycle::{EndReason, SessionSlot};
use crate::pgconn::startup::BackendConn;
use crate::pgconn::BackendTarget;
use crate::registry::TokenRecord;
use crate::wire::frame::FrameReader;
use crate::wire::messages;
use crate::wire::startup::{
    read_startup, StartupError, StartupMessage, StartupPacket, PROTOCOL_3_0,
};

/// Handle one accepted connection to the end. Never panics on client input.
pub async fn handle(proxy: Arc<Proxy>, sock: TcpStream, peer: SocketAddr) {
    let span = tracing::info_span!("conn", peer = %peer, token = tracing::field::Empty, task = tracing::field::Empty);
    // The steps up to the relay run inside the session's span; the relay enters it only
    // around its own events: a span entered and left at every poll cost about 0.6 k
    // instructions per round trip (the subscriber's span stack and filter, twice).
    // The set-up steps' state (TLS handshake, SCRAM, the backend's login) is several KiB the
    // relay never needs: on the heap, freed before the relay, so an idle session's task holds
    // the relay's state only (see the memory figure in docs/BENCHMARKS.md).
    let set_up = Box::pin(run(&proxy, sock, peer).instrument(span.clone())).await;
    if let Some((client, session)) = set_up {
        relay_step(&proxy, client, session, span).await
    }
}

/// The steps of a session: negotiate → admit → authenticate → attach backend; what the
/// relay needs, or None when the session ended before it. Each step before the relay
/// returns a [`SessionError`] that the one exit reports.
async fn run(
    proxy: &Proxy,
    sock: TcpStream,
    peer: SocketAddr,
) -> Option<(FrameReader<ClientStream>, Box<Attached>)> {
    let (mut client, startup) = match negotiate_step(proxy, sock).await {
        Ok(Some(opened)) => opened,
        Ok(None) => return None,
        Err((mut stream, e)) => {
            e.report(&mut stream).await;
            return None;
        }
    };
    let attached = async {
        admit(&mut client, &startup).await?;
        let auth_started = Instant::now();
        let authed = authenticate_step(proxy, &mut client, &startup, peer).await?;
        // Like a server, only after authentication: a stranger learns nothing from it.
        database_served(&proxy.gw.config.databases, &startup)?;
        // A token's first connection: the phases of its first query are measured.
        Phases::of(&authed.rec).record("auth", auth_started);
        attach(proxy, &mut client, &startup, authed).await
    }
    .await;
    match attached {
        // Boxed: an async fn's arguments stay in its state for its whole life, so the relay
        // step would otherwise hold this twice.
        Ok(session) => Some((client, Box::new(session))),
        Err(e) => {
            e.report(client.get_mut()).await;
            None
        }
    }
}

/// SSL/GSS negotiation and cancel requests, up to the StartupMessage, within the startup
/// timeout. None: nothing more to do (a cancel request, a refused or failed handshake).
async fn negotiate_step(
    proxy: &Proxy,
    sock: TcpStream,
) -> Result<Option<(FrameReader<ClientStream>, StartupMessage)>, (ClientStream, SessionError)> {
    let limits = &proxy.gw.config.limits;
    match tokio::time::timeout(limits.startup_timeout, negotiate(proxy, sock)).await {
        Ok(Ok(Some((stream, startup)))) => Ok(Some((FrameReader::new(stream, 10 * 1024), startup))),
        Ok(Ok(None)) => Ok(None), // cancel request or SSL refused and closed
        Ok(Err((Some(s), e))) => {
            tracing::debug!(error = %e, "startup failed");
            Err((s, SessionError::Startup(e)))
        }
        Ok(Err((None, e))) => {
            tracing::debug!(error = %e, "startup failed");
            Ok(None)
        }
        Err(_) => {
            tracing::debug!("startup timed out");
            Ok(None)
        }
    }
}

/// Refusals that do not depend on the token, and the protocol version answer.
async fn admit(
    client: &mut FrameReader<ClientStream>,
    startup: &StartupMessage,
) -> Result<(), SessionError> {
    if let Some(r) = startup.get_raw("replication") {
        if !matches!(
            String::from_utf8_lossy(r).to_ascii_lowercase().as_str(),
            "false" | "off" | "0" | "no"
        ) {
            return Err(SessionError::Replication);
        }
    }
    if let Some(reason) = super::options::forbidden(startup) {
        return Err(SessionError::ForbiddenOption(reason));
    }
    if startup.get("user").is_none() {
        return Err(SessionError::NoUser);
    }
    if startup.minor > 0 || startup.params.iter().any(|(k, _)| k.starts_with("_pq_.")) {
        let unknown: Vec<&str> = startup
            .params
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| k.starts_with("_pq_."))
            .collect();
        // The first field is the newest version we speak, as a whole version number
        // (3.0 = 196608) like PostgreSQL's own PG_PROTOCOL_LATEST; libpq rejects anything
        // below 3.0 there.
        write(
            client.get_mut(),
            &messages::negotiate_protocol_version(PROTOCOL_3_0 as i32, &unknown),
        )
        .await
        .map_err(|_| SessionError::Closed)?;
    }
    Ok(())
}

/// The database the client asked for is one the gateway answers to (see
/// `Config::databases`): none named, the user name (libpq's default), or a configured name.
fn database_served(names: &[String], startup: &StartupMessage) -> Result<(), SessionError> {
    let Some(asked) = startup.get_raw("database").filter(|d| !d.is_empty()) else {
        return Ok(());
    };
    let user = startup.get_raw("user");
    let served = names.iter().any(|n| n == "*" || n.as_bytes() == asked) || user == Some(asked);
    if served {
        return Ok(());
    }
    Err(SessionError::NoSuchDatabase(
        String::from_utf8_lossy(asked).chars().take(64).collect(),
        names.first().cloned().unwrap_or_default(),
    ))
}

/// A token that authenticated, with its session slot and its end signal.
struct Authed {
    rec: TokenRecord,
    slot: SessionSlot,
    /// Its record in the shared registry (fronts), held as long as the session.
    _shared: Option<crate::proxy::front_sessions::SharedSlot>,
    ended: watch::Receiver<Option<EndReason>>,
}

/// Authenticate within the startup timeout (failures counted, and limited, here), then take
/// one of the token's session slots.
async fn authenticate_step(
    proxy: &Proxy,
    client: &mut FrameReader<ClientStream>,
    startup: &StartupMessage,
    peer: SocketAddr,
) -> Result<Authed, SessionError> {
    let limits = &proxy.gw.config.limits;
    let user = startup.get("user").ok_or(SessionError::NoUser)?;
    let on_tls = client.get_mut().is_tls();
    let cleartext_allowed = on_tls || (peer.ip().is_loopback() && limits.cleartext_on_loopback);
    // SCRAM-SHA-256-PLUS is offered only where there is a channel to bind to.
    let binding = if on_tls {
        proxy.tls_binding.as_deref()
    } else {
        None
    };
    let authed = tokio::time::timeout(
        limits.startup_timeout,
        authenticate(&proxy.gw, client, user, cleartext_allowed, binding),
    )
    .await;
    let rec = match authed {
        Ok(Ok(rec)) => rec,
        Ok(Err(e)) => {
            metrics::counter!("sandpit_auth_failures_total", "reason" => e.reason()).increment(1);
            tracing::info!(reason = e.reason(), "authentication failed");
            // Only failures are limited (never a correct secret): over the limit, answered late.
            if over_limit(&proxy.gw, &e, Some(peer.ip())).await {
                return Err(SessionError::RateLimited);
            }
            return Err(SessionError::Auth(e));
        }
        Err(_) => {
            metrics::counter!("sandpit_auth_failures_total", "reason" => "timeout").increment(1);
            return Err(SessionError::AuthTimeout);
        }
    };
    tracing::Span::current()
        .record("token", rec.id.as_str())
        .record("task", rec.task.as_str());
    let slot = proxy
        .gw
        .acquire_session(&rec)
        .map_err(|max| SessionError::TooManyConnections {
            id: rec.id.clone(),
            max,
        })?;
    // Then across fronts: the sessions other fronts hold count too.
    let shared = match &proxy.front_sessions {
        None => None,
        Some(f) => match f.admit(&rec).await {
            Ok(Some(s)) => Some(s),
            Ok(None) => {
                return Err(SessionError::TooManyConnections {
                    id: rec.id.clone(),
                    max: rec.caps.max_connections,
                })
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot record the session in the shared registry");
                return Err(SessionError::SessionNotRecorded);
            }
        },
    };
    // Subscribe before touching the backend so an end during the fork is not missed.
    let ended = proxy.gw.runtime(&rec.id).ended();
    Ok(Authed {
        rec,
        slot,
        _shared: shared,
        ended,
    })
}

/// A session whose backend is connected and whose client has been greeted.
struct Attached {
    authed: Authed,
    /// The key the client was given; dropping it forgets it, so it lives as long as the relay.
    _cancel_key: CancelKey,
    conn: BackendConn,
    watchdog: Option<relay::Watchdog>,
    log: Option<Arc<TokenLog>>,
}

/// The backend attached: its startup parameters built, connected (once more after a
/// failure), then the client greeted and the statement log opened.
async fn attach(
    proxy: &Proxy,
    client: &mut FrameReader<ClientStream>,
    startup: &StartupMessage,
    authed: Authed,
) -> Result<Attached, SessionError> {
    let rec = &authed.rec;
    pace(proxy, rec).await?;
    let phases = Phases::of(rec);
    let timeouts = token_timeouts(rec);
    let params = backend_params(startup, &timeouts);
    let (login, mut conn) = connect_with_retry(proxy, rec, &params, phases).await?;
    let greet_started = Instant::now();
    let (cancel_key, watchdog) = greet(proxy, client, rec, &login, &mut conn).await?;
    let log = open_log(proxy, rec)?;
    phases.record("greet", greet_started);
    Ok(Attached {
        authed,
        _cancel_key: cancel_key,
        conn,
        watchdog,
        log,
    })
}

/// The client's greeting: the backend's ParameterStatus and notices, the gateway's own
/// cancel key (recorded first) and the ReadyForQuery. Also the gateway's own statement
/// timeout, which cancels through the same backend key.
async fn greet(
    proxy: &Proxy,
    client: &mut FrameReader<ClientStream>,
    rec: &TokenRecord,
    login: &BackendTarget,
    conn: &mut BackendConn,
) -> Result<(CancelKey, Option<relay::Watchdog>), SessionError> {
    let (real_pid, real_secret) = conn.key.ok_or(SessionError::NoCancelKey)?;
    let target = CancelTarget {
        endpoint: login.endpoint.clone(),
        pid: real_pid,
        secret: real_secret,
    };
    let key = proxy
        .cancel
        .mint(&rec.id, target.clone())
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "recording the cancel key failed");
            SessionError::CancelKeyNotRecorded
        })?;
    // The gateway's own statement timeout, a second after the backend's would have fired.
    let watchdog = (rec.caps.statement_timeout_ms > 0).then(|| relay::Watchdog {
        limit: std::time::Duration::from_millis(rec.caps.statement_timeout_ms + 1000),
        target,
    });

    let mut hello = BytesMut::new();
    for g in &conn.greeting {
        hello.extend_from_slice(g);
    }
    hello.extend_from_slice(&messages::backend_key_data(key.pid, key.secret));
    hello.extend_from_slice(&conn.ready);
    // The greeting's frames are views into the backend's read buffer: released now, so the
    // relay reads into that same buffer instead of allocating a second one.
    conn.greeting = Vec::new();
    conn.ready = bytes::Bytes::new();
    write(client.get_mut(), &hello)
        .await
        .map_err(|_| SessionError::Closed)?;
    drop(hello);
    tracing::info!("session started");
    client.set_max_len(proxy.gw.config.limits.max_message);
    Ok((key, watchdog))
}

/// The token's statement log, when statements are logged: a session that cannot record
/// its statements does not run them.
fn open_log(proxy: &Proxy, rec: &TokenRecord) -> Result<Option<Arc<TokenLog>>, SessionError> {
    if !proxy.gw.config.log.statements {
        return Ok(None);
    }
    match proxy
        .gw
        .logs
        .get(&proxy.gw.config.data_dir, &rec.task, &rec.id)
    {
        Ok(l) => Ok(Some(l)),
        Err(e) => {
            tracing::error!(error = %e, "cannot open the statement log");
            Err(SessionError::LogUnavailable)
        }
    }
}

/// Relay until either side ends (or the token does).
async fn relay_step(
    proxy: &Proxy,
    client: FrameReader<ClientStream>,
    s: Box<Attached>,
    span: tracing::Span,
) {
    let s = *s;
    let rec = &s.authed.rec;
    let session_no = proxy
        .sessions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    let pipeline = Box::new(
        Pipeline::new(SessionIdentity {
            token: rec.id.clone(),
            task: rec.task.clone(),
            session: session_no,
            log: s.log,
            caps: CapPolicy {
                max_rows: rec.caps.max_rows,
                max_bytes: rec.caps.max_bytes,
                mode: rec.caps.cap_mode,
            },
            allow: rec.caps.allow.clone(),
        })
        .in_span(span.clone()),
    );
    let cx = relay::Context {
        ended: s.authed.ended,
        secrets: proxy.gw.secrets(),
        watchdog: s.watchdog,
        slot: Some(&s.authed.slot),
        span: &span,
    };
    relay::run(client, s.conn.reader, pipeline, cx).await;
    span.in_scope(|| tracing::info!("session ended"));
}

type NegotiateResult =
    Result<Option<(ClientStream, StartupMessage)>, (Option<ClientStream>, StartupError)>;

/// The first byte of a TLS handshake record: a client using direct TLS (PostgreSQL 17's
/// `sslnegotiation=direct`) opens with its ClientHello instead of an SSLRequest.
const TLS_HANDSHAKE: u8 = 0x16;

/// SSLRequest / GSSENCRequest / CancelRequest / direct TLS handling, up to the StartupMessage.
async fn negotiate(proxy: &Proxy, mut sock: TcpStream) -> NegotiateResult {
    let max = proxy.gw.config.limits.max_startup_packet;
    // Only the connection's first bytes may be a ClientHello (as in PostgreSQL). A startup
    // packet's first byte is its length's high byte, never 0x16 under any sane limit.
    let mut first = [0u8; 1];
    if matches!(sock.peek(&mut first).await, Ok(1)) && first[0] == TLS_HANDSHAKE {
        let Some(acceptor) = proxy.tls.clone() else {
            tracing::debug!("direct TLS asked of a gateway without TLS; closing");
            metrics::counter!("sandpit_protocol_violations_total", "kind" => "direct_tls_without_tls").increment(1);
            return Ok(None);
        };
        return encrypted(proxy, acceptor, sock, max, true).await;
    }
    // Plain phase: read straight from the socket, unbuffered, so no byte sent before the
    // TLS handshake can ever be taken as part of the encrypted stream.
    loop {
        let pkt = match read_startup(&mut sock, max).await {
            Ok(p) => p,
            Err(e) => return Err((Some(ClientStream::Plain(sock)), e)),
        };
        match pkt {
            StartupPacket::SslRequest => {
                let Some(acceptor) = proxy.tls.clone() else {
                    if sock.write_all(b"N").await.is_err() {
                        return Ok(None);
                    }
                    continue;
                };
                // A client must wait for our answer; bytes already here are an injection attempt.
                let mut probe = [0u8; 1];
                match sock.try_read(&mut probe) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    _ => {
                        tracing::warn!("bytes after SSLRequest before the TLS handshake; closing");
                        metrics::counter!("sandpit_protocol_violations_total", "kind" => "ssl_early_bytes").increment(1);
                        return Ok(None);
                    }
                }
                if sock.write_all(b"S").await.is_err() {
                    return Ok(None);
                }
                return encrypted(proxy, acceptor, sock, max, false).await;
            }
            StartupPacket::GssEncRequest => {
                if sock.write_all(b"N").await.is_err() {
                    return Ok(None);
                }
            }
            StartupPacket::CancelRequest { pid, secret } => {
                proxy.cancel.cancel(&proxy.gw, pid, secret).await;
                return Ok(None);
            }
            StartupPacket::Startup(m) => return Ok(Some((ClientStream::Plain(sock), m))),
        }
    }
}

/// The TLS handshake, then the StartupMessage (or a cancel) over it. A direct-TLS client
/// must have agreed on ALPN `postgresql`, as PostgreSQL asks: that is what tells a Postgres
/// client from any other TLS client sent to this port.
async fn encrypted(
    proxy: &Proxy,
    acceptor: tokio_rustls::TlsAcceptor,
    sock: TcpStream,
    max: u32,
    direct: bool,
) -> NegotiateResult {
    let tls = match acceptor.accept(sock).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, direct, "TLS handshake failed");
            return Ok(None);
        }
    };
    let alpn_ok = tls.get_ref().1.alpn_protocol() == Some(super::tls::ALPN_POSTGRESQL);
    let mut tls = ClientStream::Tls(Box::new(tls));
    if direct && !alpn_ok {
        return Err((Some(tls), StartupError::DirectTlsWithoutAlpn));
    }
    // After TLS only a StartupMessage (or a cancel) is valid.
    match read_startup(&mut tls, max).await {
        Ok(StartupPacket::Startup(m)) => Ok(Some((tls, m))),
        Ok(StartupPacket::CancelRequest { pid, secret }) => {
            proxy.cancel.cancel(&proxy.gw, pid, secret).await;
            // End with close_notify, as PostgreSQL does: libpq 17+'s cancel API
            // waits for the close and calls a bare EOF over TLS an error.
            let _ = tls.shutdown().await;
            Ok(None)
        }
        Ok(_) => Err((
            Some(tls),
            StartupError::Malformed("encryption requested twice"),
        )),
        Err(e) => Err((Some(tls), e)),
    }
}

async fn write<W: AsyncWrite + Unpin>(w: &mut W, b: &[u8]) -> std::io::Result<()> {
    w.write_all(b).await?;
    w.flush().await
}

#[cfg(test)]
mod tests;
