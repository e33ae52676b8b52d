//! Cancel keys: the gateway mints its own BackendKeyData per session and routes a
//! CancelRequest carrying it to the real backend process.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rand::Rng;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

use super::backend_stream::{self, BackendStream};
use crate::provider::Endpoint;
use crate::wire::startup::encode_cancel;

/// How long a forwarded cancel may take end to end (connect, TLS, write, wait for the close).
const CANCEL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a cancel for one session goes.
#[derive(Debug, Clone)]
pub struct CancelTarget {
    /// The backend's socket or host/port, with TLS when its sessions use TLS.
    pub endpoint: Endpoint,
    /// Real backend pid.
    pub pid: i32,
    /// Real backend secret.
    pub secret: i32,
}

/// Minted keys of live sessions.
#[derive(Default)]
pub struct CancelMap {
    map: Arc<DashMap<(i32, i32), CancelTarget>>,
}

/// A minted key; removed from the map when dropped (session over).
pub struct CancelKey {
    /// The pid the client sees.
    pub pid: i32,
    /// The secret the client sees.
    pub secret: i32,
    map: Arc<DashMap<(i32, i32), CancelTarget>>,
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        self.map.remove(&(self.pid, self.secret));
    }
}

/// Send a CancelRequest for `t` straight to its backend.
pub async fn send(t: &CancelTarget) -> std::io::Result<()> {
    // Over TLS as well when the backend's sessions use it (an SSLRequest first, as libpq
    // does), so a cancel never crosses the network in the clear where sessions do not.
    let result = tokio::time::timeout(CANCEL_TIMEOUT, async {
        let mut s = backend_stream::open(&t.endpoint).await?;
        s.write_all(&encode_cancel(t.pid, t.secret)).await?;
        s.flush().await?;
        // Postgres closes the connection once it has handled the request.
        let mut sink = [0u8; 64];
        let _ = s.read(&mut sink).await;
        if let BackendStream::Tls(_) = s {
            let _ = s.shutdown().await;
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    match result {
        Ok(r) => {
            if let Err(e) = &r {
                tracing::warn!(error = %e, "forwarding a cancel request failed");
            }
            r
        }
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "cancel request timed out",
        )),
    }
}

impl CancelMap {
    /// Mint a fresh key for a session's backend.
    pub fn mint(&self, target: CancelTarget) -> CancelKey {
        let mut rng = rand::thread_rng();
        loop {
            let pid = rng.gen_range(1..i32::MAX);
            let secret: i32 = rng.gen();
            if let dashmap::mapref::entry::Entry::Vacant(v) = self.map.entry((pid, secret)) {
                v.insert(target);
                return CancelKey {
                    pid,
                    secret,
                    map: self.map.clone(),
                };
            }
        }
    }

    /// Forward a cancel to the right backend. Unknown keys are ignored, as Postgres does.
    pub async fn cancel(&self, pid: i32, secret: i32) -> bool {
        let Some(t) = self.map.get(&(pid, secret)).map(|t| t.clone()) else {
            metrics::counter!("sandpit_cancel_requests_total", "result" => "unknown").increment(1);
            return false;
        };
        let ok = send(&t).await.is_ok();
        metrics::counter!("sandpit_cancel_requests_total", "result" => if ok { "forwarded" } else { "failed" }).increment(1);
        ok
    }
}
