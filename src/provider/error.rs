//! What can go wrong in a provider.

/// Errors from a provider.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("no PostgreSQL server binaries found ({0}); install the Debian package `postgresql` or set postgres.bin_dir")]
    NoBinaries(String),
    #[error("golden snapshot: {0}")]
    Golden(String),
    #[error("fork failed: {0}")]
    Fork(String),
    #[error("backend {0} not found")]
    NotFound(String),
    #[error("backend did not become ready: {0}")]
    NotReady(String),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
    /// A remote provider's service failed or refused.
    #[error("remote service: {0}")]
    Remote(String),
    /// The admin connection of the template provider failed.
    #[error("template server: {0}")]
    Template(String),
    /// A backend's access was changed from inside (for `template`: the task role changed its
    /// own password); the change was undone, and the token should be ended.
    #[error("backend access changed outside the gateway: {0}")]
    Tampered(String),
    /// The request itself is wrong (bad masking rules, bad DSN).
    #[error("{0}")]
    Invalid(String),
    /// The provider cannot do this.
    #[error("{0}")]
    Unsupported(String),
}

impl From<crate::pgconn::tls::TlsConfigError> for ProviderError {
    fn from(e: crate::pgconn::tls::TlsConfigError) -> Self {
        ProviderError::Other(e.to_string())
    }
}

impl From<crate::pg::PgError> for ProviderError {
    fn from(e: crate::pg::PgError) -> Self {
        use crate::pg::PgError;
        match e {
            PgError::NoBinaries(m) => ProviderError::NoBinaries(m),
            PgError::NotReady(m) => ProviderError::NotReady(m),
            PgError::Io(e) => ProviderError::Io(e),
            PgError::Other(m) => ProviderError::Other(m),
        }
    }
}
