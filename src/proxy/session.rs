//! One client connection: SSL negotiation, startup, auth, backend, relay.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::Instrument;

use super::auth_flow::{authenticate, AuthError};
use super::backend::{self, BackendError};
use super::cancel::CancelTarget;
use super::caps::CapPolicy;
use super::pipeline::{Pipeline, SessionIdentity};
use super::relay;
use super::stream::ClientStream;
use super::Proxy;
use crate::lifecycle::LifecycleError;
use crate::wire::frame::FrameReader;
use crate::wire::messages::{self, Severity};
use crate::wire::startup::{
    read_startup, StartupError, StartupMessage, StartupPacket, PROTOCOL_3_0,
};

/// Startup parameters that must never reach the backend: identity is the gateway's to set.
const RESERVED_PARAMS: &[&str] = &["user", "database", "replication"];

/// Handle one accepted connection to the end. Never panics on client input.
pub async fn handle(proxy: Arc<Proxy>, sock: TcpStream, peer: SocketAddr) {
    let span = tracing::info_span!("conn", peer = %peer, token = tracing::field::Empty, task = tracing::field::Empty);
    run(proxy, sock, peer).instrument(span).await
}

async fn run(proxy: Arc<Proxy>, sock: TcpStream, peer: SocketAddr) {
    let limits = proxy.gw.config.limits.clone();
    let opened = tokio::time::timeout(limits.startup_timeout, negotiate(&proxy, sock)).await;
    let (stream, startup) = match opened {
        Ok(Ok(Some(x))) => x,
        Ok(Ok(None)) => return, // cancel request or SSL refused and closed
        Ok(Err((Some(mut s), e))) => {
            tracing::debug!(error = %e, "startup failed");
            fatal(&mut s, "08P01", &e.to_string()).await;
            return;
        }
        Ok(Err((None, e))) => {
            tracing::debug!(error = %e, "startup failed");
            return;
        }
        Err(_) => {
            tracing::debug!("startup timed out");
            return;
        }
    };
    let is_local = peer.ip().is_loopback();
    let on_tls = stream.is_tls();
    let cleartext_allowed = on_tls || (is_local && limits.cleartext_on_loopback);
    let mut client = FrameReader::new(stream, 10 * 1024);

    // Refusals that do not depend on the token.
    if let Some(r) = startup.get_raw("replication") {
        if !matches!(
            String::from_utf8_lossy(r).to_ascii_lowercase().as_str(),
            "false" | "off" | "0" | "no"
        ) {
            return fatal(
                client.get_mut(),
                "0A000",
                "replication connections are not supported by sandpit",
            )
            .await;
        }
    }
    if let Some(reason) = super::options::forbidden(&startup) {
        return fatal(client.get_mut(), "42501", &reason).await;
    }
    let Some(user) = startup.get("user").map(str::to_string) else {
        return fatal(
            client.get_mut(),
            "28000",
            "no user name in the startup packet; the user name is the token id",
        )
        .await;
    };
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
        if write(
            client.get_mut(),
            &messages::negotiate_protocol_version(PROTOCOL_3_0 as i32, &unknown),
        )
        .await
        .is_err()
        {
            return;
        }
    }

    let authed = tokio::time::timeout(
        limits.startup_timeout,
        authenticate(
            &proxy.gw,
            &mut client,
            &user,
            cleartext_allowed,
            // SCRAM-SHA-256-PLUS is offered only where there is a channel to bind to.
            if on_tls {
                proxy.tls_binding.as_deref()
            } else {
                None
            },
        ),
    )
    .await;
    let rec = match authed {
        Ok(Ok(rec)) => rec,
        Ok(Err(e)) => {
            metrics::counter!("sandpit_auth_failures_total", "reason" => e.reason()).increment(1);
            tracing::info!(reason = e.reason(), "authentication failed");
            // Only failures are limited (never a correct secret): over the limit, answered late.
            if let Some(key) = e.limit_key(peer.ip()) {
                if proxy.auth_limiter.failed(&key) {
                    metrics::counter!("sandpit_auth_rate_limited_total").increment(1);
                    tokio::time::sleep(super::ratelimit::TARPIT).await;
                    let msg = "too many authentication failures, try later";
                    return fatal(client.get_mut(), "28000", msg).await;
                }
            }
            if !matches!(e, AuthError::Lost) {
                fatal(client.get_mut(), e.sqlstate(), &e.to_string()).await;
            }
            return;
        }
        Err(_) => {
            metrics::counter!("sandpit_auth_failures_total", "reason" => "timeout").increment(1);
            return fatal(client.get_mut(), "08P01", "authentication timed out").await;
        }
    };
    tracing::Span::current()
        .record("token", rec.id.as_str())
        .record("task", rec.task.as_str());

    let _slot = match proxy.gw.acquire_session(&rec) {
        Ok(s) => s,
        Err(max) => {
            let msg = format!(
                "too many connections for token \"{}\" (max_connections is {max})",
                rec.id
            );
            return fatal(client.get_mut(), "53300", &msg).await;
        }
    };
    // Subscribe before touching the backend so an end during the fork is not missed.
    let ended = proxy.gw.runtime(&rec.id).ended();

    let timeouts = [
        (
            "statement_timeout",
            rec.caps.statement_timeout_ms.to_string(),
        ),
        (
            "idle_in_transaction_session_timeout",
            rec.caps.idle_in_transaction_timeout_ms.to_string(),
        ),
    ];
    let mut params: Vec<(&str, &[u8])> = startup
        .params
        .iter()
        .filter(|(k, _)| !RESERVED_PARAMS.contains(&k.as_str()) && !k.starts_with("_pq_."))
        .filter(|(k, _)| !timeouts.iter().any(|(t, _)| k.eq_ignore_ascii_case(t)))
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    // The token's limits are the session defaults unless the client's own `options` set
    // them (the agent can SET them anyway); the gateway's watchdog enforces the token's
    // statement timeout whatever the session says.
    let client_options = startup.get("options").unwrap_or("").to_ascii_lowercase();
    params.extend(
        timeouts
            .iter()
            .filter(|(k, _)| !client_options.contains(k))
            .map(|(k, v)| (*k, v.as_bytes())),
    );
    let max_message = limits.max_message;
    // A connection that fails on a backend the gateway believed running (its server
    // crashed) is tried once more after the backend is checked again and restarted.
    let mut retried = false;
    let (login, conn) = loop {
        let backend = match proxy.gw.backend_for(&rec.id).await {
            Ok(b) => b,
            Err(LifecycleError::NotUsable(id, state)) => {
                return fatal(
                    client.get_mut(),
                    "28000",
                    &format!("token \"{id}\" is {state}"),
                )
                .await;
            }
            Err(e) => {
                // The detail stays in our log; the client learns only that it failed.
                tracing::error!(error = %e, "backend unavailable");
                return fatal(
                    client.get_mut(),
                    "08006",
                    "could not start the scratch database for this token",
                )
                .await;
            }
        };
        // The login role follows the token's policy, so Postgres itself refuses what the
        // policy forbids (the pipeline's lexical check only labels and refuses earlier).
        let login = proxy
            .gw
            .provider
            .session_target(&backend, rec.caps.allow.as_deref());
        match backend::connect(&login, &params, max_message).await {
            Ok(c) => break (login, c),
            Err(BackendError::Refused(raw)) => {
                let out =
                    messages::scrub_error(b'E', raw.get(5..).unwrap_or(&[]), proxy.gw.secrets())
                        .unwrap_or(raw);
                let _ = write(client.get_mut(), &out).await;
                return;
            }
            Err(e) if !retried => {
                tracing::warn!(error = %e, "backend connect failed; checking the backend again");
                metrics::counter!("sandpit_backend_reconnects_total").increment(1);
                proxy.gw.backend_failed(&rec.id).await;
                retried = true;
            }
            Err(e) => {
                tracing::error!(error = %e, "backend connect failed");
                return fatal(
                    client.get_mut(),
                    "08006",
                    "could not connect to the scratch database for this token",
                )
                .await;
            }
        }
    };

    let Some((real_pid, real_secret)) = conn.key else {
        return fatal(
            client.get_mut(),
            "08P01",
            "scratch database sent no cancel key",
        )
        .await;
    };
    let target = CancelTarget {
        endpoint: login.endpoint.clone(),
        pid: real_pid,
        secret: real_secret,
    };
    let key = match proxy.cancel.mint(&rec.id, target.clone()).await {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(error = %e, "recording the cancel key failed");
            return fatal(
                client.get_mut(),
                "08006",
                "sandpit cannot record this session's cancel key",
            )
            .await;
        }
    };
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
    if write(client.get_mut(), &hello).await.is_err() {
        return;
    }
    tracing::info!("session started");
    client.set_max_len(max_message);
    let log = if proxy.gw.config.log.statements {
        match proxy
            .gw
            .logs
            .get(&proxy.gw.config.data_dir, &rec.task, &rec.id)
        {
            Ok(l) => Some(l),
            Err(e) => {
                // No statement may run unrecorded.
                tracing::error!(error = %e, "cannot open the statement log");
                let msg = "sandpit cannot write the statement log for this token";
                return fatal(client.get_mut(), "58030", msg).await;
            }
        }
    } else {
        None
    };
    let session_no = proxy
        .sessions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    let pipeline = Pipeline::new(SessionIdentity {
        token: rec.id.clone(),
        task: rec.task.clone(),
        session: session_no,
        log,
        caps: CapPolicy {
            max_rows: rec.caps.max_rows,
            max_bytes: rec.caps.max_bytes,
            mode: rec.caps.cap_mode,
        },
        allow: rec.caps.allow.clone(),
    });
    relay::run(
        client,
        conn.reader,
        ended,
        proxy.gw.secrets(),
        pipeline,
        watchdog,
    )
    .await;
    tracing::info!("session ended");
}

type NegotiateResult =
    Result<Option<(ClientStream, StartupMessage)>, (Option<ClientStream>, StartupError)>;

/// SSLRequest / GSSENCRequest / CancelRequest handling, up to the StartupMessage.
async fn negotiate(proxy: &Proxy, mut sock: TcpStream) -> NegotiateResult {
    let max = proxy.gw.config.limits.max_startup_packet;
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
                let mut tls = match acceptor.accept(sock).await {
                    Ok(t) => ClientStream::Tls(Box::new(t)),
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return Ok(None);
                    }
                };
                // After TLS only a StartupMessage (or a cancel) is valid.
                return match read_startup(&mut tls, max).await {
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
                };
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

async fn write<W: AsyncWrite + Unpin>(w: &mut W, b: &[u8]) -> std::io::Result<()> {
    w.write_all(b).await?;
    w.flush().await
}

/// Send a FATAL error and close.
async fn fatal<W: AsyncWrite + Unpin>(w: &mut W, code: &str, msg: &str) {
    let _ = write(w, &messages::error_response(Severity::Fatal, code, msg)).await;
    let _ = w.shutdown().await;
}
