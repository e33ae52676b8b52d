//! The relay: client ⇄ backend, whole messages at a time, forwarded as the bytes that were
//! read. Only errors and notices from the backend are looked into (and scrubbed).

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::lifecycle::EndReason;
use crate::wire::frame::{Frame, FrameError, FrameReader};
use crate::wire::messages::{self, Severity};

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
pub async fn run<C: AsyncRead + AsyncWrite + Unpin>(
    mut client: FrameReader<C>,
    mut backend: FrameReader<UnixStream>,
    mut ended: watch::Receiver<Option<EndReason>>,
    secrets: &[String],
) {
    let mut out = BytesMut::with_capacity(16 * 1024);
    let ending = loop {
        if let Some(r) = *ended.borrow() {
            break Ending::Ended(r);
        }
        tokio::select! {
            changed = ended.changed() => {
                if changed.is_err() { continue; }
            }
            f = client.read_frame() => {
                match f {
                    Ok(Some(f)) => {
                        let terminate = f.tag == b'X';
                        out.clear();
                        out.extend_from_slice(&f.raw);
                        // Pipelined messages already buffered go out in the same write.
                        if !terminate {
                            if let Err(e) = drain(&mut client, &mut out, |f| f.tag == b'X') { break Ending::ClientProtocol(e); }
                        }
                        metrics::counter!("sandpit_bytes_total", "direction" => "client_to_backend").increment(out.len() as u64);
                        if backend.get_mut().write_all(&out).await.is_err() { break Ending::BackendGone; }
                        if terminate || out.ends_with(&[b'X', 0, 0, 0, 4]) { break Ending::ClientTerminated; }
                    }
                    Ok(None) => break Ending::ClientGone,
                    Err(FrameError::Io(_)) | Err(FrameError::Truncated) => break Ending::ClientGone,
                    Err(e) => break Ending::ClientProtocol(e),
                }
            }
            f = backend.read_frame() => {
                match f {
                    Ok(Some(f)) => {
                        out.clear();
                        push_backend_frame(&mut out, f, secrets);
                        loop {
                            match backend.try_frame() {
                                Ok(Some(f)) => push_backend_frame(&mut out, f, secrets),
                                Ok(None) => break,
                                Err(e) => { let _ = client.get_mut().write_all(&out).await; return finish(client, backend, Ending::BackendProtocol(e)).await; }
                            }
                            if out.len() >= 64 * 1024 { break; }
                        }
                        metrics::counter!("sandpit_bytes_total", "direction" => "backend_to_client").increment(out.len() as u64);
                        if client.get_mut().write_all(&out).await.is_err() { break Ending::ClientGone; }
                    }
                    Ok(None) | Err(FrameError::Io(_)) | Err(FrameError::Truncated) => break Ending::BackendGone,
                    Err(e) => break Ending::BackendProtocol(e),
                }
            }
        }
    };
    finish(client, backend, ending).await
}

fn drain<C: AsyncRead + Unpin>(
    r: &mut FrameReader<C>,
    out: &mut BytesMut,
    stop: impl Fn(&Frame) -> bool,
) -> Result<(), FrameError> {
    while out.len() < 64 * 1024 {
        match r.try_frame()? {
            Some(f) => {
                let s = stop(&f);
                out.extend_from_slice(&f.raw);
                if s {
                    break;
                }
            }
            None => break,
        }
    }
    Ok(())
}

fn push_backend_frame(out: &mut BytesMut, f: Frame, secrets: &[String]) {
    if matches!(f.tag, b'E' | b'N') {
        if let Some(scrubbed) = messages::scrub_error(f.tag, f.body(), secrets) {
            out.extend_from_slice(&scrubbed);
            return;
        }
    }
    out.extend_from_slice(&f.raw);
}

async fn finish<C: AsyncRead + AsyncWrite + Unpin>(
    mut client: FrameReader<C>,
    mut backend: FrameReader<UnixStream>,
    ending: Ending,
) {
    tracing::debug!(?ending, "relay finished");
    let terminated = matches!(ending, Ending::ClientTerminated);
    match ending {
        Ending::Ended(reason) => {
            let _ = client
                .get_mut()
                .write_all(&messages::error_response(
                    Severity::Fatal,
                    "57P01",
                    reason.message(),
                ))
                .await;
        }
        Ending::ClientProtocol(e) => {
            metrics::counter!("sandpit_protocol_violations_total", "kind" => "client_frame")
                .increment(1);
            let _ = client
                .get_mut()
                .write_all(&messages::error_response(
                    Severity::Fatal,
                    "08P01",
                    &e.to_string(),
                ))
                .await;
        }
        Ending::BackendProtocol(e) => {
            tracing::warn!(error = %e, "backend protocol error");
            let _ = client
                .get_mut()
                .write_all(&messages::error_response(
                    Severity::Fatal,
                    "08006",
                    "lost the connection to the scratch database",
                ))
                .await;
        }
        Ending::BackendGone => {
            let _ = client
                .get_mut()
                .write_all(&messages::error_response(
                    Severity::Fatal,
                    "08006",
                    "the scratch database closed the connection",
                ))
                .await;
        }
        Ending::ClientGone | Ending::ClientTerminated => {}
    }
    if !terminated {
        // Let the backend session end cleanly rather than on a broken pipe.
        let _ = backend.get_mut().write_all(&[b'X', 0, 0, 0, 4]).await;
    }
    let _ = client.get_mut().flush().await;
    let _ = client.get_mut().shutdown().await;
    let _ = backend.get_mut().shutdown().await;
}
