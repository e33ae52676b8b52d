//! Golden versions, as a capability and as the logic its keepers share. [`GoldenVersions`]
//! is what the API and the lifecycle ask of a provider that keeps versions (`instance`,
//! `microvm`: [`Provider::versions`] is None for the others). A keeper says only what is
//! its own ([`Keeper`]: how a version is found, built and counted); which version new forks
//! copy, pins of issued tokens, switching, listing and collecting unused versions are done
//! here, once, on the files of [`store`](super::store).
//!
//! [`Provider::versions`]: crate::provider::Provider::versions

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::live::{BuildReport, LiveSpec};
use super::store::{self, GoldenInfo, Meta};
use crate::provider::{BackendTag, BoxFuture, ProviderError};

/// Golden versions of a provider: built from a live database, listed, switched to, pinned.
pub trait GoldenVersions: Send + Sync {
    /// The golden versions, oldest first.
    fn goldens(&self) -> BoxFuture<'_, Result<Vec<GoldenInfo>, ProviderError>>;
    /// Build a new golden version from a live database (not yet used for new forks).
    fn build_golden<'a>(
        &'a self,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>>;
    /// Make a version the one new forks copy; existing forks keep theirs.
    fn use_golden<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>>;
    /// The version new forks copy.
    fn active_golden(&self) -> String;
    /// Pin the active version for a token being issued, so that its fork copies that version
    /// even if another is put in use before it first connects; the pin keeps the version on
    /// disk until the fork is made or the token ends. Returns the version (None: the
    /// version is known only once forked, as on a front over workers).
    fn pin_golden<'a>(
        &'a self,
        token: &'a str,
        expires_at: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>>;
    /// Drop a token's pin (it ended, forked or not). Idempotent.
    fn unpin_golden<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
}

/// One version on disk, as forks use it (a data dir, a VM snapshot).
pub trait Version: Clone + Send + Sync {
    /// Its id.
    fn id(&self) -> &str;
}

/// What every keeper of versions holds: its root (where [`store`] keeps the files), the
/// base version, the version new forks copy, and the locks that keep switches, pins and
/// forks apart.
pub struct Versions<G> {
    root: PathBuf,
    /// Built from the configured SQL file (always kept).
    base: G,
    active: std::sync::RwLock<G>,
    /// Shared by a fork (from choosing its version until it names it) and by pins; held
    /// alone by a switch and by a collection.
    gate: tokio::sync::RwLock<()>,
    /// One build at a time.
    build_lock: tokio::sync::Mutex<()>,
}

impl<G: Version> Versions<G> {
    /// The versions under `root`, `active` in use for new forks.
    pub fn new(root: PathBuf, base: G, active: G) -> Self {
        Versions {
            root,
            base,
            active: std::sync::RwLock::new(active),
            gate: tokio::sync::RwLock::new(()),
            build_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The provider root the versions are kept under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The version built from the configured SQL file.
    pub fn base(&self) -> &G {
        &self.base
    }

    /// The version new forks copy.
    pub fn active(&self) -> G {
        self.active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Puts `golden` in use for new forks (at start, before any fork; later: [`switch`]).
    pub fn set_active(&self, golden: G) {
        *self.active.write().unwrap_or_else(|p| p.into_inner()) = golden;
    }

    /// Held by a fork from choosing its version until its dir names it (and by a reference
    /// while it copies one), so that no switch or collection comes between.
    pub async fn read_gate(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }
}

/// What a provider that keeps versions says of its own; the rest is [`GoldenVersions`],
/// implemented here for every keeper.
pub trait Keeper: Send + Sync {
    /// One version on disk.
    type Golden: Version;
    /// How logs name one built version ("golden", "microvm golden").
    const KIND: &'static str;
    /// File in a backend's directory naming the version it was copied from.
    const GOLDEN_FILE: &'static str;
    /// The shared state.
    fn version_state(&self) -> &Versions<Self::Golden>;
    /// A finished version other than the base, by a valid id (None: not on disk, not
    /// finished, or not usable by this provider).
    fn find_other(&self, id: &str) -> Option<Self::Golden>;
    /// The directory holding one directory per backend (token backends and warm-pool
    /// members), each naming its version in [`Keeper::GOLDEN_FILE`].
    fn backends_dir(&self) -> &Path;
    /// When the golden of the SQL file `id` (the base, or one of an earlier SQL file) was
    /// built, RFC 3339 (empty if unknown).
    fn sql_created(&self, id: &str) -> String;
    /// Whether the built version in `dir` is finished and usable by this provider.
    fn built_ready(&self, dir: &Path) -> bool;
    /// Fills `tmp` with a new version built from a live database.
    fn build_into<'a>(
        &'a self,
        tmp: &'a Path,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<Option<BuildReport>, ProviderError>>;
    /// Removes the review's reference backend of version `id`, if one runs.
    fn remove_reference<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Goldens of earlier contents of the SQL file that are kept while forks or pins name
    /// them (none by default), oldest first.
    fn replaced_sql_goldens(&self) -> Vec<(String, PathBuf)> {
        Vec::new()
    }
}

/// A finished version by id: the base, or one [`Keeper::find_other`] finds.
pub fn find_golden<K: Keeper>(keeper: &K, id: &str) -> Result<K::Golden, ProviderError> {
    let base = keeper.version_state().base();
    if id == base.id() {
        return Ok(base.clone());
    }
    store::valid_id(id)
        .then(|| keeper.find_other(id))
        .flatten()
        .ok_or_else(|| ProviderError::NotFound(format!("golden {id}")))
}

/// How many backends name each version (those of older gateways, naming none, count as
/// the base).
fn fork_counts<K: Keeper>(keeper: &K) -> BTreeMap<String, u64> {
    store::fork_counts(
        keeper.backends_dir(),
        |dir| store::named_version(dir, K::GOLDEN_FILE),
        keeper.version_state().base().id(),
    )
}

/// The version a fork for `tag` copies: its pin while that version is on disk, else the
/// active one. Call with the [`Versions::read_gate`] held.
pub fn golden_for<K: Keeper>(keeper: &K, tag: &BackendTag) -> K::Golden {
    let state = keeper.version_state();
    let pinned = tag
        .golden
        .clone()
        .or_else(|| store::read_pin(state.root(), &tag.token_id));
    match pinned.map(|id| find_golden(keeper, &id)) {
        Some(Ok(g)) => g,
        Some(Err(_)) => {
            tracing::warn!(token = %tag.token_id, "pinned golden version is gone; the fork copies the active one");
            state.active()
        }
        None => state.active(),
    }
}

/// Every version: those of the SQL file, then the built ones oldest first.
async fn list<K: Keeper>(keeper: &K) -> Result<Vec<GoldenInfo>, ProviderError> {
    let state = keeper.version_state();
    let _gate = state.gate.read().await;
    let active = state.active().id().to_string();
    let counts = fork_counts(keeper);
    let count = |id: &str| counts.get(id).copied().unwrap_or(0);
    let base = keeper.version_state().base().id();
    let mut out = vec![GoldenInfo::sql(
        base,
        keeper.sql_created(base),
        "golden SQL file",
        active == base,
        count(base),
    )];
    for (id, _) in keeper.replaced_sql_goldens() {
        out.push(GoldenInfo::sql(
            &id,
            keeper.sql_created(&id),
            "golden SQL file before it changed (kept while forks or pins name it)",
            active == id,
            count(&id),
        ));
    }
    for (id, dir) in store::built(state.root()) {
        if !keeper.built_ready(&dir) {
            continue;
        }
        let Some(meta) = Meta::read(&dir) else {
            continue;
        };
        out.push(GoldenInfo::live(id.clone(), meta, active == id, count(&id)));
    }
    Ok(out)
}

/// The listing of version `id`, or `missing` if it is not there.
async fn info<K: Keeper>(
    keeper: &K,
    id: &str,
    missing: impl FnOnce() -> ProviderError,
) -> Result<GoldenInfo, ProviderError> {
    list(keeper)
        .await?
        .into_iter()
        .find(|g| g.id == id)
        .ok_or_else(missing)
}

/// Builds a new version from a live database (not active until [`switch`]).
async fn build<K: Keeper>(keeper: &K, spec: &LiveSpec) -> Result<GoldenInfo, ProviderError> {
    let state = keeper.version_state();
    let _one = state.build_lock.lock().await;
    let vdir = store::make_versions_dir(state.root())?;
    let id = match &spec.id {
        None => store::new_id(),
        Some(id) if !store::valid_id(id) => {
            return Err(ProviderError::Invalid(format!(
                "invalid golden version id {id:?}"
            )))
        }
        Some(id) if id == state.base().id() || vdir.join(id).exists() => {
            return Err(ProviderError::Invalid(format!(
                "golden version {id} exists already"
            )))
        }
        Some(id) => id.clone(),
    };
    let tmp = store::building_dir(&vdir, &id);
    let started = Instant::now();
    tracing::info!(golden = %id, source = %spec.source.describe(), "building a {} from a live database", K::KIND);
    let report = match keeper.build_into(&tmp, spec).await {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            tracing::warn!(golden = %id, error = %e, "golden build failed");
            return Err(e);
        }
    };
    store::publish_build(&vdir, &tmp, &id, spec, report.as_ref())?;
    tracing::info!(golden = %id, elapsed_ms = started.elapsed().as_millis() as u64, "{} built from a live database", K::KIND);
    info(keeper, &id, || {
        ProviderError::Golden(format!("golden {id} vanished after its build"))
    })
    .await
}

/// Makes `id` the version new forks copy; forks made before keep theirs.
async fn switch<K: Keeper>(keeper: &K, id: &str) -> Result<GoldenInfo, ProviderError> {
    let state = keeper.version_state();
    {
        let _gate = state.gate.write().await;
        let golden = find_golden(keeper, id)?;
        store::write_active(state.root(), golden.id())?;
        state.set_active(golden);
    }
    tracing::info!(golden = %id, "golden version in use for new forks");
    collect(keeper).await;
    info(keeper, id, || {
        ProviderError::NotFound(format!("golden {id}"))
    })
    .await
}

/// Pins the active version for `token` (issued, expiring at `expires_at`, RFC 3339).
async fn pin<K: Keeper>(
    keeper: &K,
    token: &str,
    expires_at: &str,
) -> Result<String, ProviderError> {
    let state = keeper.version_state();
    // Under the gate: a switch or a collection cannot come between reading and pinning.
    let _gate = state.gate.read().await;
    let active = state.active().id().to_string();
    store::write_pin(state.root(), token, &active, expires_at)?;
    Ok(active)
}

/// Removes every version that is not active and that no backend and no live pin names, with
/// its reference backend: the goldens of earlier SQL files first, then the built ones. The
/// base golden is kept: it is the configured one.
pub async fn collect<K: Keeper>(keeper: &K) {
    let state = keeper.version_state();
    let _gate = state.gate.write().await;
    let active = state.active().id().to_string();
    let counts = fork_counts(keeper);
    let pinned = store::pinned_versions(state.root());
    let unused = |id: &str| id != active && !counts.contains_key(id) && !pinned.contains(id);
    for (id, dir) in keeper.replaced_sql_goldens() {
        if !unused(&id) {
            continue;
        }
        if let Err(err) = keeper.remove_reference(&id).await {
            tracing::warn!(golden = %id, error = %err, "removing a reference failed");
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(golden = %id,
                "golden of an earlier golden SQL file removed: no fork or pin uses it"),
            Err(err) => {
                tracing::warn!(golden = %id, error = %err, "removing an earlier golden failed")
            }
        }
    }
    for (id, dir) in store::built(state.root()) {
        if !unused(&id) {
            continue;
        }
        if let Err(err) = keeper.remove_reference(&id).await {
            tracing::warn!(golden = %id, error = %err, "removing a reference failed");
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(golden = %id, "golden version removed: no fork uses it"),
            Err(err) => {
                tracing::warn!(golden = %id, error = %err, "removing a golden version failed")
            }
        }
    }
}

impl<K: Keeper> GoldenVersions for K {
    fn goldens(&self) -> BoxFuture<'_, Result<Vec<GoldenInfo>, ProviderError>> {
        Box::pin(list(self))
    }

    fn build_golden<'a>(
        &'a self,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(build(self, spec))
    }

    fn use_golden<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(switch(self, id))
    }

    fn active_golden(&self) -> String {
        self.version_state().active().id().to_string()
    }

    fn pin_golden<'a>(
        &'a self,
        token: &'a str,
        expires_at: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ProviderError>> {
        Box::pin(async move { pin(self, token, expires_at).await.map(Some) })
    }

    fn unpin_golden<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            if store::remove_pin(self.version_state().root(), token)? {
                collect(self).await;
            }
            Ok(())
        })
    }
}
