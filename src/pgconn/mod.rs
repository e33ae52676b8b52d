//! Reaching a backend: where it listens (unix socket or TCP, optional TLS), the socket
//! ([`stream`]), TLS client configurations ([`tls`]), and the startup as a login role
//! ([`startup`], SCRAM with cached keys: [`scram`]). Used by the proxy, the review, the shared registry and the providers.

pub mod gate;
pub mod scram;
pub mod startup;
pub mod stream;
pub mod tls;

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a backend listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendAddr {
    /// Full path of a unix socket file (`…/.s.PGSQL.5432`).
    Unix(PathBuf),
    /// A TCP host name or address, and port.
    Tcp {
        /// Host name or IP address.
        host: String,
        /// Port.
        port: u16,
    },
}

/// TLS towards a backend (`sslmode=require` and stricter): the client configuration (which
/// decides whether the certificate is verified) and the name to send and check.
#[derive(Debug, Clone)]
pub struct BackendTls {
    /// rustls client configuration, built once per provider.
    pub config: Arc<rustls::ClientConfig>,
    /// Server name for SNI and, when verifying, the certificate check.
    pub server_name: String,
}

/// The network side of a backend: its address and, for TCP, optional TLS.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Socket or host/port.
    pub addr: BackendAddr,
    /// TLS after an SSLRequest; None = plain (always None for unix sockets).
    pub tls: Option<BackendTls>,
}

impl Endpoint {
    /// A unix socket endpoint (no TLS).
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Endpoint {
            addr: BackendAddr::Unix(path.into()),
            tls: None,
        }
    }
}

/// How the gateway reaches a running backend.
#[derive(Debug, Clone)]
pub struct BackendTarget {
    /// Where it listens.
    pub endpoint: Endpoint,
    /// Role the gateway logs in as: an agent role (or the review's), never a superuser.
    pub user: String,
    /// Database to connect to.
    pub database: String,
    /// Password for `user`, when the backend asks for one (peer auth needs none).
    pub password: Option<String>,
    /// Sets a one-login password around each login instead ([`gate`]; `template`).
    pub gate: Option<Arc<dyn gate::LoginGate>>,
}

impl BackendTarget {
    /// The unix socket path, when the backend is reached over one.
    pub fn socket_path(&self) -> Option<&Path> {
        match &self.endpoint.addr {
            BackendAddr::Unix(p) => Some(p),
            BackendAddr::Tcp { .. } => None,
        }
    }
}
