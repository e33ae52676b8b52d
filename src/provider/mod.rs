//! Where scratch databases come from. One core trait, [`Provider`], that every provider
//! implements, and optional capabilities a provider has or not, reached from it
//! ([`Provider::versions`]: golden versions, [`Provider::superuser_logins`], [`Provider::fleet`]: workers watched for loss). The
//! `instance` provider is the embedded default (its own Postgres process per fork, on a
//! copy of a golden data dir); `template`, `remote` and `microvm` are the others.

mod backend;
pub mod conninfo;
pub mod copy;
pub mod dirs;
mod error;
pub mod fleet;
pub mod golden;
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

use std::future::Future;
use std::pin::Pin;

use crate::pgconn::BackendTarget;

pub use backend::{Backend, BackendTag};
pub use error::ProviderError;
pub use golden::versions::GoldenVersions;

/// Every backend of a provider: its handle, and its tag when it has one.
pub type Listing = Vec<(String, Option<BackendTag>)>;

/// A boxed future, so that `Provider` stays object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A source of scratch databases.
pub trait Provider: Send + Sync + 'static {
    /// Short name for logs and metrics: "instance", "template", "remote" or "microvm".
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
    fn list(&self) -> BoxFuture<'_, Result<Listing, ProviderError>>;
    /// Strings that must never reach a client (socket dirs, data paths, superuser names).
    fn secrets(&self) -> Vec<String>;
    /// A token was issued: its first connection is likely soon (a warm pool grows ahead of
    /// it). Nothing by default.
    fn expect_first_connection(&self) {}
    /// Whether a warm-pool claim of this provider's members is recorded by the registry
    /// alone: the pool then hands a member out without re-tagging it, and the lifecycle
    /// re-tags it after the claim's record, off the first query's path.
    fn claims_by_record(&self) -> bool {
        false
    }
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
        golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>>;
    /// Whether the end-of-token review may make one more fork, by default, to replay its
    /// patch (destroyed right after). Providers whose forks are billed say no; a request
    /// with `verify=true` forks anyway.
    fn verify_forks_by_default(&self) -> bool {
        true
    }
    /// Stop and remove the reference backend, if one runs (gateway shutdown). Idempotent.
    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>>;
    /// Golden versions (built from a live database, switched to, pinned), for a provider
    /// that keeps them (`instance`, `microvm`); None for the others.
    fn versions(&self) -> Option<&dyn GoldenVersions> {
        None
    }
    /// Superuser sessions (see [`SuperuserLogin`]), for a provider that has them
    /// (`microvm`); None for the others.
    fn superuser_logins(&self) -> Option<&dyn SuperuserLogin> {
        None
    }
    /// The workers behind a provider over several of them (`remote.urls`), watched for
    /// loss; None for the others.
    fn fleet(&self) -> Option<&dyn fleet::Fleet> {
        None
    }
}

/// A token may log in as a superuser of its own backend. Only a provider whose backend is a
/// whole throwaway machine, with nothing of the host or of other backends inside it, has
/// this.
pub trait SuperuserLogin: Send + Sync {
    /// How a superuser token's agent session logs in to `backend`.
    fn superuser_target(&self, backend: &Backend) -> BackendTarget;
}
