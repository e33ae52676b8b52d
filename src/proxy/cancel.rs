//! Cancel keys: the gateway mints its own BackendKeyData per session and routes a
//! CancelRequest carrying it to the real backend process. With a shared registry each minted
//! key is also recorded there (token and real key), so a CancelRequest that a load balancer
//! sends to another replica reaches the same backend: that replica looks the key up and
//! sends the cancel to the token's backend itself.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rand::Rng;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

use crate::lifecycle::Gateway;
use crate::pgconn::stream::{self as backend_stream, BackendStream};
use crate::pgconn::Endpoint;
use crate::registry::postgres::{PgStore, SharedCancel};
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
    /// The shared registry and this replica's id, when replicas share one.
    shared: Option<(Arc<PgStore>, String)>,
}

/// A minted key; removed from the map (and the shared registry) when dropped (session over).
pub struct CancelKey {
    /// The pid the client sees.
    pub pid: i32,
    /// The secret the client sees.
    pub secret: i32,
    map: Arc<DashMap<(i32, i32), CancelTarget>>,
    shared: Option<Arc<PgStore>>,
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        let key = (self.pid, self.secret);
        self.map.remove(&key);
        if let Some(store) = self.shared.take() {
            // Best effort: a key left behind is purged by the janitor once its token ends,
            // and at this replica's next start; it only ever names a finished session.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    if let Err(e) = store.cancel_remove(key).await {
                        tracing::debug!(error = %e, "removing a shared cancel key failed");
                    }
                });
            }
        }
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

/// The key a client sees: the backend's real pid (drivers compare it with
/// `pg_backend_pid()` and notification pids; a made-up one hides nothing) and a secret the
/// gateway draws, which alone routes a cancel (the real secret never leaves the gateway).
fn client_key(real_pid: i32) -> (i32, i32) {
    (real_pid, rand::thread_rng().gen())
}

impl CancelMap {
    /// A map whose keys are also recorded in the shared registry under `replica`.
    pub fn shared(store: Arc<PgStore>, replica: String) -> CancelMap {
        CancelMap {
            map: Arc::default(),
            shared: Some((store, replica)),
        }
    }

    /// Mint a fresh key for a session's backend of `token`. With a shared registry the key
    /// is recorded there before this returns, so it is known to every replica before the
    /// client can learn it.
    pub async fn mint(
        &self,
        token: &str,
        target: CancelTarget,
    ) -> Result<CancelKey, crate::registry::RegistryError> {
        loop {
            let key = client_key(target.pid);
            if let dashmap::mapref::entry::Entry::Vacant(v) = self.map.entry(key) {
                v.insert(target.clone());
            } else {
                continue;
            }
            let mut minted = CancelKey {
                pid: key.0,
                secret: key.1,
                map: self.map.clone(),
                shared: None,
            };
            let Some((store, replica)) = &self.shared else {
                return Ok(minted);
            };
            let row = SharedCancel {
                token: token.to_string(),
                pid: target.pid,
                secret: target.secret,
            };
            // On a clash with another replica's key, `minted` drops (freeing the local entry)
            // and another key is drawn.
            if store.cancel_put(key, &row, replica).await? {
                minted.shared = Some(store.clone());
                return Ok(minted);
            }
        }
    }

    /// Forward a cancel to the right backend. Unknown keys are ignored, as Postgres does.
    /// A key minted by another replica is looked up in the shared registry and sent to the
    /// token's backend from here.
    pub async fn cancel(&self, gw: &Gateway, pid: i32, secret: i32) -> bool {
        let local = self.map.get(&(pid, secret)).map(|t| t.clone());
        let (t, via) = match local {
            Some(t) => (t, "forwarded"),
            None => match self.remote_target(gw, (pid, secret)).await {
                Some(t) => (t, "forwarded_shared"),
                None => {
                    metrics::counter!("sandpit_cancel_requests_total", "result" => "unknown")
                        .increment(1);
                    return false;
                }
            },
        };
        let ok = send(&t).await.is_ok();
        metrics::counter!("sandpit_cancel_requests_total", "result" => if ok { via } else { "failed" }).increment(1);
        ok
    }

    async fn remote_target(&self, gw: &Gateway, key: (i32, i32)) -> Option<CancelTarget> {
        let (store, _) = self.shared.as_ref()?;
        let row = match store.cancel_get(key).await {
            Ok(r) => r?,
            Err(e) => {
                tracing::warn!(error = %e, "looking up a shared cancel key failed");
                return None;
            }
        };
        match gw.running_backend(&row.token).await {
            Ok(Some(b)) => Some(CancelTarget {
                endpoint: b.target.endpoint,
                pid: row.pid,
                secret: row.secret,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(token = %row.token, error = %e, "no backend for a shared cancel key");
                None
            }
        }
    }
}
