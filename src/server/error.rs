//! Why `serve` could not start.

use std::path::PathBuf;

use crate::proxy::tls;

use super::lock;

/// Startup failures of `serve`.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Provider(#[from] crate::provider::ProviderError),
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Locked(#[from] lock::LockError),
    #[error("cannot start the statement log's ticker thread: {0}")]
    LogTicker(std::io::Error),
    #[error("registry.shared_dir: {0}")]
    SharedDir(#[from] crate::journal::log::LogError),
}
