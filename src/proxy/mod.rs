//! The Postgres-facing side: listener, TLS, startup and auth, backend connect, relay, cancel.

pub mod auth_flow;
pub mod cancel;
pub mod caps;
pub mod gate;
pub mod options;
pub mod pipeline;
pub mod relay;
pub mod session;
pub mod stream;
pub mod tls;
pub mod turn;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::lifecycle::Gateway;
use cancel::CancelMap;

/// Shared state of the Postgres listener.
pub struct Proxy {
    /// Gateway state (tokens, provider).
    pub gw: Arc<Gateway>,
    /// Cancel keys minted by the gateway.
    pub cancel: CancelMap,
    /// TLS acceptor when TLS is on.
    pub tls: Option<TlsAcceptor>,
    /// Numbers sessions for the statement log.
    pub sessions: std::sync::atomic::AtomicU64,
    /// The TLS certificate's tls-server-end-point data, when SCRAM-SHA-256-PLUS is offered.
    pub tls_binding: Option<Vec<u8>>,
}

impl Proxy {
    /// Build the listener state.
    /// `replica` names this process in the shared registry's cancel keys.
    pub fn new(gw: Arc<Gateway>, tls: Option<tls::ServerTls>, replica: String) -> Arc<Proxy> {
        let (tls, tls_binding) = match tls {
            Some(t) => (Some(t.acceptor), t.binding),
            None => (None, None),
        };
        let cancel = match gw.registry.shared() {
            Some(store) => CancelMap::shared(store.clone(), replica),
            None => CancelMap::default(),
        };
        Arc::new(Proxy {
            gw,
            cancel,
            tls,
            sessions: Default::default(),
            tls_binding,
        })
    }

    /// Accept connections until `shutdown` turns true. Each connection is its own task;
    /// a failure in one never touches another.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    if *shutdown.borrow() { break; }
                }
                accepted = listener.accept() => {
                    match accepted {
                        Ok((sock, peer)) => {
                            let _ = sock.set_nodelay(true);
                            let this = self.clone();
                            tokio::spawn(async move { session::handle(this, sock, peer).await });
                        }
                        Err(e) => {
                            // EMFILE and friends: back off instead of spinning.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        }
    }
}
