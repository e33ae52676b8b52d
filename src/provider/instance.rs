//! The `instance` provider: one Postgres process per fork, on a copy of the golden data dir,
//! reachable only over a unix socket, optionally in an empty network namespace.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use sha2::{Digest, Sha256};
use tokio::process::Child;

use super::copy::{self, CopyMethod};
use super::golden::{self, GoldenCtx, AGENT, DATABASE, SUPERUSER};
use super::golden_build::LiveSpec;
use super::versions::{self, Golden, GoldenInfo};
use super::{Backend, BackendTag, BackendTarget, BoxFuture, Endpoint, Provider, ProviderError};
use crate::pg::process::{self, ServerSpec};
use crate::pg::user::{self, RunAs};
use crate::pg::{self as pgbin, PgBinaries};

/// Name of the tag file inside an instance dir.
const TAG_FILE: &str = "sandpit-tag.json";
/// Where destroyed instances wait to be deleted (same filesystem, so the move is a rename).
const TRASH_DIR: &str = "trash";
/// Grace period for a fast shutdown before the process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// Grace period for an immediate shutdown.
const DESTROY_GRACE: Duration = Duration::from_secs(5);
/// Directory (under the real root, outside `instances/`, so `list()` never sees it) of the
/// reference backend: a pristine fork of the golden that review diffs compare against.
const REFERENCE_DIR: &str = "reference";
/// Key prefix of reference servers in the children map (token handles start with `sp_`).
const REFERENCE_KEY: &str = "reference";
/// File in an instance dir naming the golden version it was copied from.
pub(super) const GOLDEN_FILE: &str = "golden-version";

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
    /// The golden built from the configured SQL file (always kept).
    pub(super) base: Golden,
    /// The golden new forks copy.
    pub(super) active: std::sync::RwLock<Golden>,
    /// Held (shared) while a golden is being copied, (exclusive) while unused versions are
    /// removed, so a version is never removed under a copy.
    pub(super) versions_gate: tokio::sync::RwLock<()>,
    /// One build from a live database at a time.
    pub(super) build_lock: tokio::sync::Mutex<()>,
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
        let (golden_dir, _built) = golden::ensure(&ctx).await?;
        let base = Golden::base(golden_dir);
        versions::remove_unfinished(&real_root);
        let active = versions::active_at_start(&real_root, &base);
        tracing::info!(golden = %active.id, "active golden");
        let provider = InstanceProvider {
            bins,
            run_as,
            netns,
            root: cfg.root,
            real_root,
            base,
            active: std::sync::RwLock::new(active),
            versions_gate: tokio::sync::RwLock::new(()),
            build_lock: tokio::sync::Mutex::new(()),
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
        provider.collect_versions().await;
        Ok(provider)
    }

    /// Stops every reference server and removes their files (also the single `reference/`
    /// of older gateways).
    pub(super) async fn remove_references(&self) -> Result<(), ProviderError> {
        let dir = self.real_root.join(REFERENCE_DIR);
        if dir.join("data").exists() {
            self.remove_reference_at(REFERENCE_KEY, &dir).await?;
        }
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let id = e.file_name().to_string_lossy().to_string();
                if validate_handle(&id).is_ok() && e.path().is_dir() {
                    self.remove_reference(&id).await?;
                }
            }
        }
        Ok(())
    }

    /// Stops the reference server of golden `id` (if any) and removes its files.
    pub(super) async fn remove_reference(&self, id: &str) -> Result<(), ProviderError> {
        let inst = self.real_root.join(REFERENCE_DIR).join(id);
        self.remove_reference_at(&format!("{REFERENCE_KEY}-{id}"), &inst)
            .await
    }

    async fn remove_reference_at(&self, key: &str, inst: &Path) -> Result<(), ProviderError> {
        let sock = golden::socket_dir_for(inst);
        if inst.join("data").exists() {
            self.stop_server(key, inst, Signal::SIGQUIT, DESTROY_GRACE)
                .await;
        }
        if inst.exists() {
            let dir = inst.to_path_buf();
            tokio::task::spawn_blocking(move || match fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .await
            .map_err(|e| ProviderError::Other(format!("remove task: {e}")))??;
        }
        golden::remove_socket_dir(&sock, inst)?;
        Ok(())
    }

    /// The running reference backend of golden `version` (the active one when None),
    /// forked from that golden on first use.
    async fn reference_inner(&self, version: Option<&str>) -> Result<Backend, ProviderError> {
        let _guard = self.reference_lock.lock().await;
        let _gate = self.versions_gate.read().await;
        let golden = match version {
            None => self.active_golden_now(),
            Some(id) => self.find_golden(id)?,
        };
        let key = format!("{REFERENCE_KEY}-{}", golden.id);
        make_dir(&self.real_root.join(REFERENCE_DIR), 0o711)?;
        let inst = self.real_root.join(REFERENCE_DIR).join(&golden.id);
        let data = inst.join("data");
        let sock = golden::socket_dir_for(&inst);
        let backend = Backend {
            handle: key.clone(),
            target: BackendTarget {
                endpoint: Endpoint::unix(process::socket_path(&sock)),
                user: AGENT.to_string(),
                database: DATABASE.to_string(),
                password: None,
            },
            method: "reference".to_string(),
            netns: self.netns,
            golden: Some(golden.id.clone()),
        };
        if let Some(pf) = process::read_pid_file(&data) {
            if process::is_postmaster_of(pf.pid, &data)
                && pf.status == "ready"
                && backend.target.socket_path().is_some_and(|p| p.exists())
            {
                return Ok(backend);
            }
        }
        // Missing, stopped or half-started: nobody ever writes to it, so a fresh copy is
        // always equivalent and simpler than recovering the old one.
        self.remove_reference(&golden.id).await?;
        let t0 = Instant::now();
        make_dir(&inst, 0o711)?;
        let src = golden.dir.join("data");
        let (method, owner) = (self.copy, self.run_as.clone());
        tokio::task::spawn_blocking(move || copy::copy_tree(&src, &data, method, &owner))
            .await
            .map_err(|e| ProviderError::Fork(format!("copy task: {e}")))??;
        if let Err(e) = self.start(&key, &inst).await {
            let _ = self.remove_reference(&golden.id).await;
            return Err(e);
        }
        tracing::info!(
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "reference backend started"
        );
        Ok(backend)
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
        &self.base.dir
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
            },
            method: method.to_string(),
            netns: self.netns,
            golden: versions::instance_golden(&inst),
        }
    }

    /// Starts the instance's server and remembers the child.
    async fn start(&self, handle: &str, inst: &Path) -> Result<(), ProviderError> {
        let sock = golden::socket_dir_for(inst);
        golden::prepare_socket_dir(&sock, &self.run_as)?;
        let data = inst.join("data");
        let log = inst.join("postgres.log");
        let extra: Vec<(&str, String)> = self
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let spec = ServerSpec {
            bins: &self.bins,
            run_as: &self.run_as,
            netns: self.netns,
            data: &data,
            socket_dir: &sock,
            log: &log,
            max_connections: self.max_connections,
            extra: &extra,
        };
        let child = process::start_postgres(&spec).await?;
        self.lock_children().insert(handle.to_string(), child);
        Ok(())
    }

    fn lock_children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Child>> {
        // A panic while holding the lock cannot leave the map inconsistent: keep going.
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops whatever postmaster runs for `inst` with `sig`, waiting up to `grace`.
    pub(super) async fn stop_server(
        &self,
        handle: &str,
        inst: &Path,
        sig: Signal,
        grace: Duration,
    ) {
        let data = inst.join("data");
        let mut child = self.lock_children().remove(handle);
        let child_pid = child.as_ref().and_then(|c| c.id()).map(|p| p as i32);
        let file_pid = process::read_pid_file(&data)
            .map(|pf| pf.pid)
            .filter(|&pid| process::is_postmaster_of(pid, &data));
        if let Some(pid) = child_pid {
            process::stop_postmaster(pid, child.as_mut(), sig, grace).await;
        }
        if let Some(pid) = file_pid.filter(|p| Some(*p) != child_pid) {
            process::stop_postmaster(pid, None, sig, grace).await;
        }
    }

    async fn fork_inner(&self, tag: &BackendTag, inst: &Path) -> Result<(), ProviderError> {
        let t0 = Instant::now();
        {
            // The version is named before the gate is released, so it is never removed
            // under this instance.
            let _gate = self.versions_gate.read().await;
            let golden = self.active_golden_now();
            fs::write(inst.join(GOLDEN_FILE), &golden.id)?;
            let src = golden.dir.join("data");
            let dst = inst.join("data");
            let (method, owner) = (self.copy, self.run_as.clone());
            tokio::task::spawn_blocking(move || copy::copy_tree(&src, &dst, method, &owner))
                .await
                .map_err(|e| ProviderError::Fork(format!("copy task: {e}")))??;
        }
        let json =
            serde_json::to_vec_pretty(tag).map_err(|e| ProviderError::Fork(format!("tag: {e}")))?;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(inst.join(TAG_FILE))?;
        std::io::Write::write_all(&mut f, &json)?;
        let copied = t0.elapsed();
        self.start(&tag.token_id, inst).await?;
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
                removing
                    .await
                    .map_err(|e| ProviderError::Other(format!("remove task: {e}")))??;
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
        self.collect_versions().await;
        Ok(())
    }

    async fn ensure_inner(&self, handle: &str) -> Result<Backend, ProviderError> {
        let inst = self.inst_dir(handle)?;
        let data = inst.join("data");
        if !data.is_dir() {
            return Err(ProviderError::NotFound(handle.to_string()));
        }
        let sock = golden::socket_dir_for(&inst);
        let deadline = Instant::now() + process::READY_TIMEOUT;
        loop {
            match process::read_pid_file(&data) {
                Some(pf) if process::is_postmaster_of(pf.pid, &data) => {
                    if pf.status == "ready" {
                        if process::socket_path(&sock).exists() {
                            return Ok(self.backend(handle, "adopted"));
                        }
                        // Running but unreachable (e.g. a /tmp cleaner removed its socket dir):
                        // restart it so it listens again.
                        tracing::warn!(
                            handle,
                            "instance running without its socket; restarting it"
                        );
                        self.stop_server(handle, &inst, Signal::SIGINT, STOP_GRACE)
                            .await;
                        continue;
                    }
                    // Starting up (or shutting down): wait for it to settle.
                    if Instant::now() > deadline {
                        return Err(ProviderError::NotReady(format!(
                            "instance {handle} stuck in state {:?}",
                            pf.status
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => break,
            }
        }
        // Stale lock files could name a pid that now belongs to someone else; no postmaster of
        // this instance runs, so they are safe to drop. Postgres does crash recovery itself.
        let _ = fs::remove_file(data.join("postmaster.pid"));
        let _ = fs::remove_file(sock.join(format!("{}.lock", process::SOCKET_FILE)));
        let _ = fs::remove_file(process::socket_path(&sock));
        self.lock_children().remove(handle);
        let t0 = Instant::now();
        self.start(handle, &inst).await?;
        tracing::info!(
            handle,
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "instance restarted"
        );
        Ok(self.backend(handle, "restart"))
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
                let tag = fs::read(e.path().join(TAG_FILE))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<BackendTag>(&b).ok());
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
        Box::pin(async move {
            let inst = self.inst_dir(handle)?;
            let bytes =
                serde_json::to_vec_pretty(tag).map_err(|e| ProviderError::Other(e.to_string()))?;
            // Written whole then renamed: a janitor never reads a half-written tag.
            let tmp = inst.join(format!("{TAG_FILE}.tmp"));
            {
                use std::io::Write;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&bytes)?;
                f.sync_all()?;
            }
            fs::rename(&tmp, inst.join(TAG_FILE))?;
            Ok(())
        })
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

    fn goldens(&self) -> BoxFuture<'_, Result<Vec<GoldenInfo>, ProviderError>> {
        Box::pin(async move { self.list_goldens().await })
    }

    fn build_golden<'a>(
        &'a self,
        spec: &'a LiveSpec,
    ) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(self.build_version(spec))
    }

    fn use_golden<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<GoldenInfo, ProviderError>> {
        Box::pin(self.use_version(id))
    }

    fn active_golden(&self) -> Option<String> {
        Some(self.active_golden_now().id)
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

pub(super) fn make_dir(dir: &Path, mode: u32) -> Result<(), ProviderError> {
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => {
            return Err(ProviderError::Other(format!(
                "creating {}: {e}",
                dir.display()
            )))
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Makes `root` a directory the Postgres user can traverse and returns its canonical path.
/// If an ancestor is closed to that user (e.g. under /root, or a 0700 tempdir), the real
/// directory is `/var/tmp/sandpit-<hash>` and `root` becomes a symlink to it.
fn prepare_root(root: &Path, run_as: &RunAs) -> Result<PathBuf, ProviderError> {
    let name = root.file_name().ok_or_else(|| {
        ProviderError::Other(format!(
            "data root {} has no final component",
            root.display()
        ))
    })?;
    let parent = match root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent)?;
    let abs = fs::canonicalize(&parent)?.join(name);
    let real = match fs::symlink_metadata(&abs) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = fs::read_link(&abs)?;
            let target = if target.is_absolute() {
                target
            } else {
                abs.parent().unwrap_or(Path::new("/")).join(target)
            };
            // The fallback may have been cleaned (e.g. /var/tmp after a reboot): recreate it.
            if !target.exists() {
                make_owned_dir(&target)?;
            }
            fs::canonicalize(&abs)?
        }
        Ok(m) if m.is_dir() => {
            if m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o011 != 0o011 {
                fs::set_permissions(&abs, fs::Permissions::from_mode(0o711))?;
            }
            abs.clone()
        }
        Ok(_) => {
            return Err(ProviderError::Other(format!(
                "data root {} is not a directory",
                abs.display()
            )))
        }
        Err(_) if user::can_traverse(abs.parent().unwrap_or(Path::new("/")), run_as) => {
            make_dir(&abs, 0o711)?;
            abs.clone()
        }
        Err(_) => {
            let h = hex::encode(Sha256::digest(abs.as_os_str().as_encoded_bytes()));
            let fallback = PathBuf::from(format!("/var/tmp/sandpit-{}", &h[..12]));
            make_owned_dir(&fallback)?;
            std::os::unix::fs::symlink(&fallback, &abs)?;
            tracing::info!(root = %abs.display(), real = %fallback.display(),
                "data root is not reachable by the postgres user; using a fallback directory");
            fallback
        }
    };
    if !user::can_traverse(&real, run_as) {
        return Err(ProviderError::Other(format!(
            "postgres user {} cannot reach data root {}; choose a data dir outside private directories",
            run_as.name,
            real.display()
        )));
    }
    Ok(real)
}

/// Creates (or accepts) a 0711 directory we own; refuses a symlink or someone else's directory,
/// since the fallback lives in a world-writable place.
fn make_owned_dir(dir: &Path) -> Result<(), ProviderError> {
    make_dir_all_parent(dir)?;
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() => {}
        Ok(_) => {
            return Err(ProviderError::Other(format!(
                "{} exists and is not our directory",
                dir.display()
            )))
        }
        Err(_) => make_dir(dir, 0o711)?,
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o711))?;
    Ok(())
}

fn make_dir_all_parent(dir: &Path) -> Result<(), ProviderError> {
    if let Some(p) = dir.parent() {
        fs::create_dir_all(p)?;
    }
    Ok(())
}
