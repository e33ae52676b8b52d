//! Where scratch databases come from. One trait; the `instance` provider is the
//! embedded default (its own Postgres process per fork, on a copy of a golden data dir).

pub mod conninfo;
pub mod copy;
pub mod golden;
pub mod golden_build;
pub mod golden_sql;
pub mod holds;
pub mod instance;
pub mod mask;
pub mod microvm;
pub mod pool;
pub mod pool_sizing;
pub mod quiesce;
pub mod remote;
pub mod remote_api;
pub mod tag_file;
pub mod template;
pub mod version_store;
pub mod versions;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use crate::pgconn::BackendTarget;

/// A boxed future, so that `Provider` stays object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a backend is tagged with, inside the backend itself, so a janitor can find it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendTag {
    /// Token id that owns the backend.
    pub token_id: String,
    /// Task name of the token.
    pub task: String,
    /// Expiry of the token, RFC 3339.
    pub expires_at: String,
    /// Id of the gateway (its data dir's `gateway.id`) that made the backend; empty in tags
    /// written before it existed.
    #[serde(default)]
    pub gateway_id: String,
    /// Golden version the token was pinned to when it was issued (None: the active one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
}

/// A running backend.
#[derive(Debug, Clone)]
pub struct Backend {
    /// Provider-specific handle, persisted in the registry (for `instance`: the instance dir name).
    pub handle: String,
    /// Where to connect.
    pub target: BackendTarget,
    /// How the fork was made ("reflink", "copy", "btrfs-snapshot", "restart", "adopted").
    pub method: String,
    /// Whether the backend runs in an empty network namespace.
    pub netns: bool,
    /// Golden version it was copied from, for providers that keep versions.
    pub golden: Option<String>,
}

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

fn versions_unsupported<T>(name: &str) -> Result<T, ProviderError> {
    Err(ProviderError::Unsupported(format!(
        "golden versions and golden build are supported with the instance and microvm providers, not {name}"
    )))
}

/// A source of scratch databases.
pub trait Provider: Send + Sync + 'static {
    /// Short name for logs and metrics ("instance", "template", "remote", "microvm").
    fn name(&self) -> &'static str;
    /// Fork a new backend from the golden, tagged with `tag`, and wait until it accepts connections.
    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>>;
    /// Make sure an existing backend (known from the registry, e.g. after a gateway restart) is
    /// running: adopt it if it is, start it again if it is not.
    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>>;
    /// Check, before a session and at janitor passes, that a backend is still reachable only
    /// the way the gateway set it up. A change found is undone on the spot and reported as
    /// [`ProviderError::Tampered`] (again at every later check): the caller ends the token.
    fn check_access<'a>(&'a self, _handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
    /// Whether a backend's server process runs now, when the provider can tell cheaply
    /// (None: it cannot, or the backend does not exist). The janitor restarts a backend the
    /// gateway believes running that is found dead.
    fn server_running(&self, _handle: &str) -> Option<bool> {
        None
    }
    /// End every client session on a running backend, for one adopted after a gateway crash:
    /// its sessions died with the old gateway, but a backend busy in a statement keeps
    /// running until it next writes to its client. Returns how many were ended.
    fn end_stale_sessions<'a>(
        &'a self,
        _handle: &'a str,
    ) -> BoxFuture<'a, Result<u64, ProviderError>> {
        Box::pin(async { Ok(0) })
    }
    /// Stop a backend and remove everything it had (processes, files). Idempotent.
    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Stop a backend but keep its data, for a graceful gateway shutdown. Idempotent.
    fn stop<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Every backend that exists, with its tag (for the janitor).
    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>>;
    /// Strings that must never reach a client (socket dirs, data paths, superuser names).
    fn secrets(&self) -> Vec<String>;
    /// Re-tag an existing backend (a warm-pool member claimed by a token). Providers that
    /// keep no tag of their own may leave this as is.
    fn retag<'a>(
        &'a self,
        _handle: &'a str,
        _tag: &'a BackendTag,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
    /// How an agent session whose token allows the statement kinds `allow` (None: no
    /// policy) logs in to `backend`. Providers with a login role per policy level return
    /// that role, so the server itself refuses what the policy forbids; the default is the
    /// backend's own login.
    fn session_target(&self, backend: &Backend, _allow: Option<&[String]>) -> BackendTarget {
        backend.target.clone()
    }
    /// Whether a token may log in as a superuser of its own backend (see
    /// [`Provider::superuser_target`]). Only a provider whose backend is a whole throwaway
    /// machine, with nothing of the host or of other backends inside it, says yes.
    fn superuser_sessions(&self) -> bool {
        false
    }
    /// How a superuser token's agent session logs in to `backend` (None: the provider has
    /// no such login, see [`Provider::superuser_sessions`]).
    fn superuser_target(&self, _backend: &Backend) -> Option<BackendTarget> {
        None
    }
    /// How the review logs in to a token's `backend`. Providers with a review role return
    /// it (its settings are out of the agent's reach); the default is the backend's login.
    fn review_target(&self, backend: &Backend) -> BackendTarget {
        backend.target.clone()
    }
    /// The backend of an ended token, started if need be, for its end-of-token review. A
    /// provider that refuses a tampered backend's sessions ([`ProviderError::Tampered`]:
    /// access already put back) still hands it out here, as no session can reach it.
    fn ended_backend<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        self.ensure_running(handle)
    }
    /// Before the end-of-token review of an ended token: end every agent session on the
    /// backend (the gateway's or not) and roll back every prepared transaction it left, as
    /// a role allowed to, so no lock of the agent's can hold the review back. Providers
    /// without such a role cannot, and say so.
    fn quiesce<'a>(&'a self, _backend: &'a Backend) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
    /// A pristine fork of the golden, used only as the "before" side of a review diff. Started
    /// on first use and kept running; never handed to an agent, never listed by [`list`]
    /// (so a janitor cannot mistake it for a token's backend), replaced when the golden
    /// changes and removed by [`release_reference`].
    ///
    /// `golden` names the version the scratch database was copied from (None: the active).
    ///
    /// [`list`]: Provider::list
    /// [`release_reference`]: Provider::release_reference
    fn reference<'a>(
        &'a self,
        _golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async {
            Err(ProviderError::Other(format!(
                "provider {} has no reference backend",
                self.name()
            )))
        })
    }
    /// Whether the end-of-token review may make one more fork, by default, to replay its
    /// patch (destroyed right after). Providers whose forks are billed say no; a request
    /// with `verify=true` forks anyway.
    fn verify_forks_by_default(&self) -> bool {
        true
    }
    /// Stop and remove the reference backend, if one runs (gateway shutdown). Idempotent.
    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
    /// The golden versions, oldest first.
    fn goldens(&self) -> BoxFuture<'_, Result<Vec<versions::GoldenInfo>, ProviderError>> {
        Box::pin(async { versions_unsupported(self.name()) })
    }
    /// Build a new golden version from a live database (not yet used for new forks).
    fn build_golden<'a>(
        &'a self,
        _spec: &'a golden_build::LiveSpec,
    ) -> BoxFuture<'a, Result<versions::GoldenInfo, ProviderError>> {
        Box::pin(async { versions_unsupported(self.name()) })
    }
    /// Make a version the one new forks copy; existing forks keep theirs.
    fn use_golden<'a>(
        &'a self,
        _id: &'a str,
    ) -> BoxFuture<'a, Result<versions::GoldenInfo, ProviderError>> {
        Box::pin(async { versions_unsupported(self.name()) })
    }
    /// The version new forks copy, for providers that keep versions.
    fn active_golden(&self) -> Option<String> {
        None
    }
    /// Pin the active version for a token being issued, so that its fork copies that version
    /// even if another is put in use before it first connects; the pin keeps the version on
    /// disk until the fork is made or the token ends. Returns the version (None: no versions).
    fn pin_golden<'a>(
        &'a self,
        _token: &'a str,
        _expires_at: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async { Ok(None) })
    }
    /// Drop a token's pin (it ended, forked or not). Idempotent.
    fn unpin_golden<'a>(&'a self, _token: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
}
