//! The `instance` provider: one Postgres process per fork, on a copy of the golden data dir,
//! reachable only over a unix socket, optionally in an empty network namespace.

mod reference;
mod root;
mod server;
mod versions;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::process::Child;

use super::copy::{self, CopyMethod};
use super::dirs::make_dir;
use super::golden::versions::{self as shared, GoldenVersions, Versions};
use super::golden::{self, sql, GoldenCtx, AGENT, DATABASE, REVIEWER, SUPERUSER};
use super::tag_file;
use super::{Backend, BackendTag, BoxFuture, Provider, ProviderError};
use crate::pg::process;
use crate::pg::user::{self, RunAs};
use crate::pg::{self as pgbin, PgBinaries};
use crate::pgconn::{BackendTarget, Endpoint};
use root::prepare_root;
use versions::{Golden, GOLDEN_FILE};

/// Name of the tag file inside an instance dir.
/// Where destroyed instances wait to be deleted (same filesystem, so the move is a rename).
const TRASH_DIR: &str = "trash";
/// Grace period for a fast shutdown before the process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// Grace period for an immediate shutdown.
const DESTROY_GRACE: Duration = Duration::from_secs(5);

/// Settings of the `instance` provider.
#[derive(Debug, Clone)]
pub struct InstanceConfig {
    /// Directory holding `postgres`, `initdb`, `psql` (config `postgres.bin_dir`); found if None.
    pub bin_dir: Option<PathBuf>,
    /// `<data dir>/pg`: the golden and the instances live under it.
    pub root: PathBuf,
    /// SQL file the golden is built from.
    pub golden_sql: PathBuf,
    /// `max_connections` of each scratch instance.
    pub max_connections: u32,
    /// OS user for Postgres when the gateway runs as root (default `sandpit`).
    pub run_as: Option<String>,
    /// Try to start each instance in an empty network namespace.
    pub netns: bool,
    /// Extra server settings for every scratch instance (e.g. `temp_file_limit`).
    pub settings: Vec<(String, String)>,
}

impl InstanceConfig {
    /// Defaults for everything but the root and the golden SQL file.
    pub fn new(root: impl Into<PathBuf>, golden_sql: impl Into<PathBuf>) -> Self {
        InstanceConfig {
            bin_dir: None,
            root: root.into(),
            golden_sql: golden_sql.into(),
            max_connections: 20,
            run_as: None,
            netns: true,
            settings: Vec::new(),
        }
    }
}

/// Forks are separate Postgres servers on copies of a stopped golden data directory.
pub struct InstanceProvider {
    pub(super) bins: PgBinaries,
    pub(super) run_as: RunAs,
    pub(super) netns: bool,
    root: PathBuf,
    pub(super) real_root: PathBuf,
    /// The golden built from the configured SQL file (always kept), the one new forks copy,
    /// pins, and the gate that keeps a version from being removed under a copy.
    versions: Versions<Golden>,
    pub(super) gateway_user: String,
    pub(super) instances: PathBuf,
    copy: CopyMethod,
    pub(super) max_connections: u32,
    settings: Vec<(String, String)>,
    /// Children we spawned, so exited ones are reaped; after a restart only pids are known.
    children: Mutex<HashMap<String, Child>>,
    /// Single-flight start of the reference backend.
    reference_lock: tokio::sync::Mutex<()>,
}

impl InstanceProvider {
    /// Finds binaries, resolves the OS user, builds the golden if needed (may take ~10-30 s the first time).
    pub async fn new(cfg: InstanceConfig) -> Result<Self, ProviderError> {
        let bins = pgbin::find_binaries(cfg.bin_dir.as_deref())?;
        let run_as = user::resolve(cfg.run_as.as_deref())?;
        let gateway_user = user::gateway_user_name()?;
        let real_root = prepare_root(&cfg.root, &run_as)?;
        let instances = real_root.join("instances");
        make_dir(&instances, 0o711)?;
        // Destroyed instances are renamed here and deleted in the background; whatever an
        // earlier run left half-deleted goes now.
        let trash = real_root.join(TRASH_DIR);
        if trash.exists() {
            let t = trash.clone();
            let _ = tokio::task::spawn_blocking(move || fs::remove_dir_all(&t)).await;
        }
        make_dir(&trash, 0o700)?;
        let netns = cfg.netns && process::probe_netns(&bins, &run_as);
        let copy = copy::probe(&real_root);
        tracing::info!(
            bin_dir = %bins.bin_dir.display(),
            major = bins.major,
            os_user = %run_as.name,
            netns,
            copy_method = copy.as_str(),
            "instance provider"
        );
        let ctx = GoldenCtx {
            bins: &bins,
            run_as: &run_as,
            netns,
            root: &real_root,
            sql_path: &cfg.golden_sql,
            gateway_user: &gateway_user,
            max_connections: cfg.max_connections,
        };
        let ensured = sql::ensure(&ctx).await?;
        if let Some(e) = &ensured.failed {
            // Loud, but the service goes on: an operator's typo must not take it down, and
            // the live tokens forked from the previous golden stay reviewable.
            tracing::error!(
                sql = %cfg.golden_sql.display(),
                error = %e,
                serving = %ensured.dir.display(),
                "THE GOLDEN SQL COULD NOT BE BUILT: new tokens still get the previous golden; \
                 fix the SQL file and restart the gateway"
            );
        }
        metrics::gauge!("sandpit_golden_sql_stale").set(if ensured.failed.is_some() {
            1.0
        } else {
            0.0
        });
        let base = Golden::base(ensured.dir);
        let versions = versions::at_start(&real_root, base);
        tracing::info!(golden = %versions.active().id, "active golden");
        let provider = InstanceProvider {
            bins,
            run_as,
            netns,
            root: cfg.root,
            real_root,
            versions,
            gateway_user,
            instances,
            copy,
            max_connections: cfg.max_connections,
            settings: cfg.settings,
            children: Mutex::new(HashMap::new()),
            reference_lock: tokio::sync::Mutex::new(()),
        };
        // A reference left by a crashed gateway may be a fork of an older golden: start afresh.
        provider.remove_references().await?;
        // Versions whose last fork ended while the gateway was down.
        shared::collect(&provider).await;
        Ok(provider)
    }

    /// The copy method forks use ("reflink", "copy", "btrfs-snapshot").
    pub fn copy_method(&self) -> &str {
        self.copy.as_str()
    }

    /// Superuser role name (for tests that need to prove containment; never given to agents).
    pub fn superuser(&self) -> &str {
        SUPERUSER
    }

    /// Directory of the golden built from the SQL file (its data dir is `<golden_dir>/data`).
    pub fn golden_dir(&self) -> &Path {
        &self.versions.base().dir
    }

    /// The real directory everything lives in (the configured root, or its fallback target).
    pub fn real_root(&self) -> &Path {
        &self.real_root
    }

    /// Whether instances start in an empty network namespace.
    pub fn netns(&self) -> bool {
        self.netns
    }

    fn inst_dir(&self, handle: &str) -> Result<PathBuf, ProviderError> {
        validate_handle(handle)?;
        Ok(self.instances.join(handle))
    }

    fn backend(&self, handle: &str, method: &str) -> Backend {
        let inst = self.instances.join(handle);
        Backend {
            handle: handle.to_string(),
            target: BackendTarget {
                endpoint: Endpoint::unix(process::socket_path(&golden::socket_dir_for(&inst))),
                user: AGENT.to_string(),
                database: DATABASE.to_string(),
                password: None,
                gate: None,
            },
            method: method.to_string(),
            netns: self.netns,
            golden: golden::store::named_version(&inst, GOLDEN_FILE),
        }
    }

    /// `backend`'s login as `role`, unless its fork predates the policy roles.
    fn login_as(&self, backend: &Backend, role: &str) -> BackendTarget {
        let mut target = backend.target.clone();
        let legacy = self
            .inst_dir(&backend.handle)
            .map(|inst| golden::predates_policy_roles(&inst.join("data")))
            .unwrap_or(false);
        if legacy {
            tracing::debug!(handle = %backend.handle, "fork of a golden without policy roles: logging in as the agent");
        } else {
            target.user = role.to_string();
        }
        target
    }

    async fn fork_inner(&self, tag: &BackendTag, inst: &Path) -> Result<(), ProviderError> {
        let t0 = Instant::now();
        {
            // The version is named before the gate is released, so it is never removed
            // under this instance.
            let _gate = self.versions.read_gate().await;
            let golden = shared::golden_for(self, tag);
            fs::write(inst.join(GOLDEN_FILE), &golden.id)?;
            let src = golden.dir.join("data");
            let dst = inst.join("data");
            let (method, owner) = (self.copy, self.run_as.clone());
            tokio::task::spawn_blocking(move || copy::copy_tree(&src, &dst, method, &owner))
                .await
                .map_err(|source| ProviderError::ForkTask {
                    what: "copy task".into(),
                    source,
                })??;
        }
        tag_file::write(inst, tag)?;
        let copied = t0.elapsed();
        self.start(&tag.token_id, inst).await?;
        // The instance's own golden-version file names the version from now on.
        golden::store::remove_pin(&self.real_root, &tag.token_id)?;
        tracing::debug!(handle = %tag.token_id, copy_ms = copied.as_millis() as u64,
            start_ms = (t0.elapsed() - copied).as_millis() as u64, "fork phases");
        Ok(())
    }

    async fn destroy_inner(&self, handle: &str) -> Result<(), ProviderError> {
        let inst = self.inst_dir(handle)?;
        let sock = golden::socket_dir_for(&inst);
        if inst.exists() {
            self.stop_server(handle, &inst, Signal::SIGQUIT, DESTROY_GRACE)
                .await;
            // Gone from its place at once (a rename); the bytes are freed in the background so
            // a slow disk never holds up the end of a token.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let doomed = self
                .real_root
                .join(TRASH_DIR)
                .join(format!("{handle}.{nanos}"));
            let dir = match fs::rename(&inst, &doomed) {
                Ok(()) => doomed,
                Err(_) => inst.clone(),
            };
            let removing = tokio::task::spawn_blocking(move || match fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            });
            if inst.exists() {
                // The rename failed: delete in place, and wait for it.
                removing.await.map_err(|source| ProviderError::Task {
                    what: "remove task".into(),
                    source,
                })??;
            } else {
                tokio::spawn(async move {
                    if let Ok(Err(e)) = removing.await {
                        tracing::warn!(error = %e, "removing a destroyed instance failed");
                    }
                });
            }
        } else {
            self.lock_children().remove(handle);
        }
        golden::remove_socket_dir(&sock, &inst)?;
        tracing::debug!(handle, "instance destroyed");
        shared::collect(self).await;
        Ok(())
    }
}

impl Provider for InstanceProvider {
    fn name(&self) -> &'static str {
        "instance"
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let t0 = Instant::now();
            let handle = tag.token_id.as_str();
            let inst = self.inst_dir(handle)?;
            match fs::DirBuilder::new().mode(0o711).create(&inst) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(ProviderError::Fork(format!(
                        "instance {handle} already exists"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
            fs::set_permissions(&inst, fs::Permissions::from_mode(0o711))?;
            if let Err(e) = self.fork_inner(tag, &inst).await {
                if let Err(e2) = self.destroy_inner(handle).await {
                    tracing::warn!(handle, error = %e2, "cleanup after failed fork");
                }
                return Err(e);
            }
            let backend = self.backend(handle, self.copy.as_str());
            tracing::info!(handle, method = %backend.method, netns = self.netns,
                elapsed_ms = t0.elapsed().as_millis() as u64, "instance forked");
            Ok(backend)
        })
    }

    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(self.ensure_inner(handle))
    }

    fn server_running(&self, handle: &str) -> Option<bool> {
        InstanceProvider::server_running(self, handle)
    }

    fn end_stale_sessions<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<u64, ProviderError>> {
        Box::pin(self.end_stale_sessions_inner(handle))
    }

    fn session_target(&self, backend: &Backend, allow: Option<&[String]>) -> BackendTarget {
        self.login_as(backend, golden::login_role(allow))
    }

    fn review_target(&self, backend: &Backend) -> BackendTarget {
        self.login_as(backend, REVIEWER)
    }

    fn quiesce<'a>(&'a self, backend: &'a Backend) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            // The instance's own admin role (peer login of the gateway's OS user): the
            // server is this token's alone, so every other session on it is the agent's.
            let mut admin = backend.target.clone();
            admin.user = SUPERUSER.to_string();
            admin.password = None;
            super::quiesce::whole_server(&admin).await.map(|_| ())
        })
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.destroy_inner(handle))
    }

    fn stop<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let inst = self.inst_dir(handle)?;
            if inst.exists() {
                self.stop_server(handle, &inst, Signal::SIGINT, STOP_GRACE)
                    .await;
            }
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let rd = match fs::read_dir(&self.instances) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(e.into()),
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if validate_handle(&name).is_err() || !e.path().is_dir() {
                    continue;
                }
                let tag = tag_file::read(&e.path());
                out.push((name, tag));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }

    fn retag<'a>(
        &'a self,
        handle: &'a str,
        tag: &'a BackendTag,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        // Only a hint: the registry's claim record names the owner (see claims_by_record).
        Box::pin(async move { tag_file::write_hint(&self.inst_dir(handle)?, tag) })
    }

    fn claims_by_record(&self) -> bool {
        true
    }

    fn reference<'a>(
        &'a self,
        golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(self.reference_inner(golden))
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async move {
            let _guard = self.reference_lock.lock().await;
            self.remove_references().await
        })
    }

    fn versions(&self) -> Option<&dyn GoldenVersions> {
        Some(self)
    }

    fn secrets(&self) -> Vec<String> {
        let mut v = vec![
            self.root.display().to_string(),
            self.real_root.display().to_string(),
            "/tmp/sandpit-s-".to_string(),
            SUPERUSER.to_string(),
        ];
        if let Ok(abs) = std::path::absolute(&self.root) {
            v.push(abs.display().to_string());
        }
        v.sort();
        v.dedup();
        v
    }
}

/// Handles become directory names: only a conservative alphabet, no path tricks.
pub(super) fn validate_handle(handle: &str) -> Result<(), ProviderError> {
    let ok = !handle.is_empty()
        && handle.len() <= 64
        && !handle.starts_with('.')
        && handle
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(ProviderError::Other(format!(
            "invalid backend handle {handle:?}"
        )))
    }
}
