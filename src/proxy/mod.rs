//! The Postgres-facing side: listener, TLS, startup and auth, backend connect, relay, cancel.

pub mod auth_flow;
pub mod cancel;
pub mod caps;
pub mod cores;
pub mod front_sessions;
pub mod gate;
pub mod options;
pub mod pipeline;
pub mod relay;
pub mod session;
pub mod stream;
pub mod tls;
pub mod turn;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::lifecycle::Gateway;
use cancel::CancelMap;
use cores::RelayCores;

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
    /// With a shared registry: this front's sessions recorded there (`max_connections`
    /// across fronts).
    pub front_sessions: Option<front_sessions::FrontSessions>,
    /// The relay threads sessions run on; None: they run on the caller's runtime.
    pub cores: Option<RelayCores>,
}

impl Proxy {
    /// Build the listener state.
    /// `replica` names this process in the shared registry's cancel keys.
    pub fn new(gw: Arc<Gateway>, tls: Option<tls::ServerTls>, replica: String) -> Arc<Proxy> {
        let (tls, tls_binding) = match tls {
            Some(t) => (Some(t.acceptor), t.binding),
            None => (None, None),
        };
        let front_sessions = gw
            .registry
            .shared()
            .map(|store| front_sessions::FrontSessions::new(store.clone(), replica.clone()));
        let cancel = match gw.registry.shared() {
            Some(store) => CancelMap::shared(store.clone(), replica),
            None => CancelMap::default(),
        };
        // Off by default: without work stealing, a flood stalls the sessions dealt to its
        // thread (docs/BENCHMARKS.md, "Relay cost, round six").
        let cores = match gw.config.relay_threads {
            0 => None,
            n => match RelayCores::start(n) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(error = %e, "no relay threads; sessions run on the main pool");
                    None
                }
            },
        };
        Arc::new(Proxy {
            cores,
            gw,
            cancel,
            tls,
            sessions: Default::default(),
            tls_binding,
            front_sessions,
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
                            self.clone().start_session(sock, peer);
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

    /// Run one accepted connection to its end on a relay thread (or here, without them).
    fn start_session(self: Arc<Self>, sock: TcpStream, peer: SocketAddr) {
        let Some(cores) = &self.cores else {
            tokio::spawn(async move { session::handle(self, sock, peer).await });
            return;
        };
        // Moved to the relay thread's reactor: leaves this one, joins that one there.
        let sock = match sock.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, %peer, "cannot hand an accepted connection over");
                return;
            }
        };
        let this = self.clone();
        cores.spawn(move || async move {
            match TcpStream::from_std(sock) {
                Ok(sock) => session::handle(this, sock, peer).await,
                Err(e) => tracing::warn!(error = %e, %peer, "cannot adopt an accepted connection"),
            }
        });
    }

    /// Run `work` on the main pool (forks, resumes: work that may take long or spawn tasks
    /// of its own), never on a relay thread. None: it panicked or the pool is stopping.
    pub async fn on_main<F, T>(&self, work: F) -> Option<T>
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        match &self.cores {
            Some(c) => c.on_main(work).await,
            None => Some(work.await),
        }
    }
}
