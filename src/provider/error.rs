//! What can go wrong in a provider. A failure with an underlying error keeps it as its
//! `source` (with what was being done, where the message needs it); plain refusals and
//! failures reported only as text (a program's stderr, a service's message) carry a string.

use std::io;

use tokio::task::JoinError;

use super::mask::MaskError;
use crate::pg::PgError;
use crate::pgconn::tls::TlsConfigError;

/// Errors from a provider.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("no PostgreSQL server binaries found ({0}); install the Debian package `postgresql` or set postgres.bin_dir")]
    NoBinaries(String),
    /// A golden build step failed or refused (the text says how: a program's stderr, a
    /// mismatch).
    #[error("golden snapshot: {0}")]
    Golden(String),
    /// A golden build step failed on an i/o error (running a program, reading a file).
    #[error("golden snapshot: {what}: {source}")]
    GoldenIo {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A golden build step failed in the staging server.
    #[error("golden snapshot: {what}: {source}")]
    GoldenSql {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A built version's metadata could not be encoded.
    #[error("golden snapshot: golden metadata: {0}")]
    GoldenMeta(#[source] serde_json::Error),
    /// Masking failed in the staging copy of a live database.
    #[error("golden snapshot: {0}")]
    Mask(#[source] MaskError),
    #[error("fork failed: {0}")]
    Fork(String),
    /// A fork step failed on an i/o error (copying a file, running a program).
    #[error("fork failed: {what}: {source}")]
    ForkIo {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A fork step's blocking task died.
    #[error("fork failed: {what}: {source}")]
    ForkTask {
        what: String,
        #[source]
        source: JoinError,
    },
    #[error("backend {0} not found")]
    NotFound(String),
    /// The service does not offer what was asked (a sandbox service without the golden
    /// versions extension).
    #[error("{0}")]
    Unsupported(String),
    /// Refused as things are (a golden version missing on some worker).
    #[error("{0}")]
    Refused(String),
    /// The shared registry's view of the workers' room (`sandpit_workers`) failed.
    #[error("worker room in the shared registry: {0}")]
    RoomBook(String),
    #[error("backend did not become ready: {0}")]
    NotReady(String),
    /// Waiting for a backend ended on an i/o error.
    #[error("backend did not become ready: {what}: {source}")]
    NotReadyIo {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// An i/o error while doing `what` (creating a directory, talking to a VM).
    #[error("{what}: {source}")]
    IoAt {
        what: String,
        #[source]
        source: io::Error,
    },
    /// JSON that could not be written or read (a tag, a VM's answer).
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A blocking task died.
    #[error("{what}: {source}")]
    Task {
        what: String,
        #[source]
        source: JoinError,
    },
    /// A statement or login on a backend failed (the server's message and SQLSTATE shown).
    #[error("{what}: {}", describe(source))]
    Sql {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{0}")]
    Other(String),
    /// A remote provider's service failed or refused.
    #[error("remote service: {0}")]
    Remote(String),
    /// The HTTP client of a remote provider failed.
    #[error("remote service: {what}: {source}")]
    RemoteHttp {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    /// A remote provider's settings could not be read (its CA file).
    #[error("remote service: {what}: {source}")]
    RemoteIo {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A remote provider's request or answer was not the JSON expected.
    #[error("remote service: {what}: {source}")]
    RemoteJson {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// The admin connection of the template provider failed or refused.
    #[error("template server: {0}")]
    Template(String),
    /// The template provider's admin connection could not be opened.
    #[error("template server: {what}: {source}")]
    TemplateIo {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A statement of the template provider's admin connection failed (the server's
    /// message and SQLSTATE shown).
    #[error("template server: {what}: {}", describe(source))]
    TemplateSql {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
    /// A backend's access was changed from inside (for `template`: the task role changed its
    /// own password); the change was undone, and the token should be ended.
    #[error("backend access changed outside the gateway: {0}")]
    Tampered(String),
    /// The request itself is wrong (bad masking rules, bad DSN).
    #[error("{0}")]
    Invalid(String),
    /// The masking rules of a request do not parse.
    #[error("{0}")]
    InvalidMask(#[source] MaskError),
    /// The TLS settings of a backend connection are wrong.
    #[error(transparent)]
    Tls(#[from] TlsConfigError),
}

/// The server's message and SQLSTATE when there is one (tokio-postgres' own Display says
/// only "db error").
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

impl ProviderError {
    /// A golden build step that failed on an i/o error.
    pub fn golden_io(what: impl Into<String>) -> impl FnOnce(io::Error) -> ProviderError {
        let what = what.into();
        move |source| ProviderError::GoldenIo { what, source }
    }

    /// A golden build step that failed in the staging server.
    pub fn golden_sql(
        what: impl Into<String>,
    ) -> impl FnOnce(tokio_postgres::Error) -> ProviderError {
        let what = what.into();
        move |source| ProviderError::GoldenSql { what, source }
    }

    /// An i/o error while doing `what`.
    pub fn io_at(what: impl Into<String>) -> impl FnOnce(io::Error) -> ProviderError {
        let what = what.into();
        move |source| ProviderError::IoAt { what, source }
    }
}

impl From<PgError> for ProviderError {
    fn from(e: PgError) -> Self {
        match e {
            PgError::NoBinaries(m) => ProviderError::NoBinaries(m),
            PgError::NotReady(m) => ProviderError::NotReady(m),
            PgError::Io(e) => ProviderError::Io(e),
            PgError::Other(m) => ProviderError::Other(m),
        }
    }
}
