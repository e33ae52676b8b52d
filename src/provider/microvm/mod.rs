//! The `microvm` provider: each scratch database is its own QEMU virtual machine, restored
//! from a memory snapshot of a running golden VM (VM templating: the golden's RAM is a shared
//! file; each clone maps it privately, copy-on-write, and gets its own qcow2 overlay). The
//! guest has no network device; the gateway reaches its Postgres through a unix socket
//! bridged over one virtio-serial port ([`bridge`]). Golden versions built from a live
//! database are further snapshots of the same kind ([`versions`]).

mod accel;
mod bridge;
mod golden;
mod image;
mod image_build;
mod qemu;
mod versions;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

use self::bridge::Bridge;
use self::qemu::{Image, Qmp, VmSpec};
use super::golden::store;
use super::golden::versions::{self as shared, GoldenVersions, Versions};
use super::golden::{login_role, AGENT, DATABASE, REVIEWER, SUPERUSER};
use super::tag_file;
use super::{Backend, BackendTag, BoxFuture, Provider, ProviderError, SuperuserLogin};
use crate::pg::process;
use crate::pgconn::{BackendTarget, Endpoint};

pub use image::recipe_hash;

/// In a VM dir: the id of the golden snapshot the clone was restored from.
const GOLDEN_FILE: &str = "golden";
/// Prefix of a reference clone's bridge key (`/` is in no VM handle); its dir is
/// `refs/<golden id>` (never listed).
const REFERENCE: &str = "reference/";

/// Settings of the `microvm` provider.
#[derive(Debug, Clone)]
pub struct MicrovmConfig {
    /// `<data dir>/microvm`: goldens and VMs live under it.
    pub root: PathBuf,
    /// The QEMU binary (`qemu-system-x86_64`).
    pub qemu: PathBuf,
    /// "auto" (KVM when a probe shows it runs a standard guest, else TCG), "tcg" or "kvm";
    /// resolved once at start to "kvm" or "tcg" ([`accel`]).
    pub accel: String,
    /// Guest memory per VM, MiB.
    pub memory_mib: u32,
    /// vCPUs per VM.
    pub vcpus: u32,
    /// A ready image dir (vmlinuz, initrd.img, root.qcow2); None: build one.
    pub image: Option<PathBuf>,
    /// Where built images are cached by recipe hash.
    pub image_dir: PathBuf,
    /// SQL file the golden database is built from.
    pub golden_sql: PathBuf,
    /// Host Postgres client binaries (psql) dir; found if None.
    pub bin_dir: Option<PathBuf>,
    /// Longest wait for a cold boot (golden build) or a restore.
    pub boot_timeout: Duration,
}

/// VMs restored from a snapshot of the golden VM.
pub struct MicrovmProvider {
    cfg: MicrovmConfig,
    image: Image,
    /// The snapshot built from the SQL file (always kept), the one new forks restore from,
    /// pins, and the gate that keeps a version from being removed under a restore (shared)
    /// or while the active one is switched.
    versions: Versions<golden::Snapshot>,
    /// What snapshots restore only with ([`golden::shape`]); built versions of another
    /// shape are not used.
    shape: String,
    vms: PathBuf,
    refs: PathBuf,
    /// The host side of each running VM's channel, by handle.
    bridges: Mutex<HashMap<String, Bridge>>,
    reference_lock: tokio::sync::Mutex<()>,
}

fn validate_handle(handle: &str) -> Result<(), ProviderError> {
    let ok = !handle.is_empty()
        && handle.len() <= 64
        && handle
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ProviderError::NotFound(handle.to_string()))
    }
}

impl MicrovmProvider {
    /// Builds (or finds) the image and the golden snapshot; the first run builds the image
    /// (minutes) and boots the golden once (tens of seconds under TCG).
    pub async fn new(mut cfg: MicrovmConfig) -> Result<Self, ProviderError> {
        std::fs::create_dir_all(&cfg.root)?;
        // Resolved before anything hashes or starts a VM: the golden snapshot's key holds
        // the accelerator actually used (a snapshot does not restore across them).
        let (accel, why) = accel::resolve(&cfg.accel, &cfg.qemu, &cfg.root).await;
        tracing::info!(setting = %cfg.accel, accel = accel.as_str(), "microvm accelerator: {why}");
        cfg.accel = accel.as_str().to_string();
        let vms = cfg.root.join("vms");
        let refs = cfg.root.join("refs");
        std::fs::create_dir_all(&vms)?;
        // A reference left by an earlier run may be of an older golden: start afresh.
        if refs.exists() {
            if let Ok(rd) = std::fs::read_dir(&refs) {
                for e in rd.flatten() {
                    qemu::kill(&e.path()).await;
                }
            }
            let _ = std::fs::remove_dir_all(&refs);
        }
        std::fs::create_dir_all(&refs)?;
        let image = image::ensure(cfg.image.as_deref(), &cfg.image_dir).await?;
        tracing::info!(
            qemu = %cfg.qemu.display(),
            accel = %cfg.accel,
            memory_mib = cfg.memory_mib,
            vcpus = cfg.vcpus,
            image = %image.dir.display(),
            "microvm provider ({} acceleration)",
            match accel {
                accel::Accel::Kvm => "hardware KVM",
                accel::Accel::Tcg => "TCG software emulation",
            }
        );
        let base = golden::ensure(&cfg, &image).await?;
        versions::remove_unfinished(&cfg.root).await;
        let shape = golden::shape(&cfg, &image);
        let root = cfg.root.clone();
        let p = MicrovmProvider {
            cfg,
            image,
            versions: Versions::new(root, base.clone(), base),
            shape,
            vms,
            refs,
            bridges: Mutex::new(HashMap::new()),
            reference_lock: tokio::sync::Mutex::new(()),
        };
        let active = p.active_at_start();
        tracing::info!(golden = %active.id, "active golden");
        p.versions.set_active(active);
        shared::collect(&p).await;
        Ok(p)
    }

    fn vm_dir(&self, handle: &str) -> Result<PathBuf, ProviderError> {
        validate_handle(handle)?;
        Ok(self.vms.join(handle))
    }

    fn backend(&self, handle: &str, dir: &Path, method: &str, golden: Option<String>) -> Backend {
        Backend {
            handle: handle.to_string(),
            target: BackendTarget {
                endpoint: Endpoint::unix(process::socket_path(dir)),
                user: AGENT.to_string(),
                database: DATABASE.to_string(),
                password: None,
                gate: None,
            },
            method: method.to_string(),
            // No network device at all: stronger than an empty namespace.
            netns: true,
            golden,
        }
    }

    fn spec<'a>(
        &'a self,
        dir: &'a Path,
        disk: &'a Path,
        mem: &'a Path,
        name: &'a str,
        incoming: bool,
    ) -> VmSpec<'a> {
        VmSpec {
            qemu: &self.cfg.qemu,
            accel: &self.cfg.accel,
            memory_mib: self.cfg.memory_mib,
            vcpus: self.cfg.vcpus,
            image: &self.image,
            dir,
            disk,
            mem,
            shared: false,
            incoming,
            name,
        }
    }

    /// Restores a clone of `snap` into `dir` (which holds nothing but what the caller
    /// wrote) and starts its bridge. Call with the versions gate held (shared).
    async fn restore(
        &self,
        handle: &str,
        dir: &Path,
        snap: &golden::Snapshot,
    ) -> Result<(), ProviderError> {
        let t0 = Instant::now();
        let disk = dir.join("disk.qcow2");
        qemu::overlay(&snap.disk, &disk).await?;
        std::fs::write(dir.join(GOLDEN_FILE), &snap.id)?;
        let name = format!("sandpit-vm-{handle}");
        qemu::start(&self.spec(dir, &disk, &snap.mem, &name, true))?;
        let deadline = self.cfg.boot_timeout;
        // QEMU waits for this connection (wait=on) before it goes on, so the guest never
        // sees its channel closed.
        let chan = bridge::connect_channel(&dir.join(qemu::CHANNEL), deadline).await?;
        let b = Bridge::start(chan, &process::socket_path(dir))?;
        let mut qmp = Qmp::connect(&dir.join(qemu::QMP), deadline).await?;
        qmp.execute(
            "migrate-set-capabilities",
            json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]}),
        )
        .await?;
        let uri = format!("file:{}", snap.state.display());
        qmp.execute("migrate-incoming", json!({ "uri": uri }))
            .await?;
        qmp.wait_running(deadline).await?;
        b.set_clock().await?;
        b.reseed().await?;
        b.ping(deadline).await?;
        tracing::debug!(
            handle,
            ms = t0.elapsed().as_millis() as u64,
            "microvm clone restored"
        );
        if let Ok(mut m) = self.bridges.lock() {
            m.insert(handle.to_string(), b);
        }
        Ok(())
    }

    /// Boots a stopped VM from its own disk (its memory is gone: Postgres recovers).
    async fn cold_boot(&self, handle: &str, dir: &Path) -> Result<(), ProviderError> {
        let disk = dir.join("disk.qcow2");
        let name = format!("sandpit-vm-{handle}");
        // The memory file only backs the RAM, mapped privately: a boot starts afresh, so
        // the base's (always kept, of this VM shape) serves whatever the clone's version.
        qemu::start(&self.spec(dir, &disk, &self.versions.base().mem, &name, false))?;
        let deadline = self.cfg.boot_timeout;
        let chan = bridge::connect_channel(&dir.join(qemu::CHANNEL), deadline).await?;
        let b = Bridge::start(chan, &process::socket_path(dir))?;
        b.ping(deadline).await?;
        b.set_clock().await?;
        golden::wait_postgres(&self.versions.base().psql, dir, deadline).await?;
        if let Ok(mut m) = self.bridges.lock() {
            m.insert(handle.to_string(), b);
        }
        Ok(())
    }

    fn drop_bridge(&self, handle: &str) {
        if let Ok(mut m) = self.bridges.lock() {
            m.remove(handle);
        }
    }

    /// Stops and removes the reference clone of golden `id`, if there is one.
    async fn remove_reference(&self, id: &str) -> Result<(), ProviderError> {
        if !store::valid_id(id) {
            return Ok(());
        }
        let key = format!("{REFERENCE}{id}");
        self.remove_vm(&key, &self.refs.join(id)).await
    }

    async fn remove_vm(&self, handle: &str, dir: &Path) -> Result<(), ProviderError> {
        self.drop_bridge(handle);
        qemu::kill(dir).await;
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Adopts a running VM (a new bridge on its channel) or boots it again.
    async fn ensure(&self, handle: &str, dir: &Path) -> Result<(), ProviderError> {
        let has_bridge = self
            .bridges
            .lock()
            .map(|m| m.contains_key(handle))
            .unwrap_or(false);
        if qemu::alive(dir).is_some() {
            if has_bridge {
                return Ok(());
            }
            let chan =
                bridge::connect_channel(&dir.join(qemu::CHANNEL), self.cfg.boot_timeout).await?;
            let b = Bridge::start(chan, &process::socket_path(dir))?;
            b.ping(self.cfg.boot_timeout).await?;
            if let Ok(mut m) = self.bridges.lock() {
                m.insert(handle.to_string(), b);
            }
            return Ok(());
        }
        self.drop_bridge(handle);
        self.cold_boot(handle, dir).await
    }
}

impl Provider for MicrovmProvider {
    fn name(&self) -> &'static str {
        "microvm"
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let handle = tag.token_id.clone();
            let dir = self.vm_dir(&handle)?;
            if dir.exists() {
                self.remove_vm(&handle, &dir).await?;
            }
            std::fs::create_dir_all(&dir)?;
            tag_file::write(&dir, tag)?;
            let restored = {
                // The clone names its version before the gate is released, so that version
                // is never removed under it.
                let _gate = self.versions.read_gate().await;
                let snap = shared::golden_for(self, tag);
                self.restore(&handle, &dir, &snap).await.map(|()| snap.id)
            };
            let id = match restored {
                Ok(id) => id,
                Err(e) => {
                    let log = std::fs::read_to_string(dir.join("qemu.log")).unwrap_or_default();
                    let _ = self.remove_vm(&handle, &dir).await;
                    return Err(ProviderError::Fork(format!(
                        "{e}; qemu: {}",
                        super::golden::tail(&log)
                    )));
                }
            };
            // The clone's own golden file names the version from now on.
            store::remove_pin(&self.cfg.root, &tag.token_id)?;
            Ok(self.backend(&handle, &dir, "snapshot-restore", Some(id)))
        })
    }

    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let dir = self.vm_dir(handle)?;
            if !dir.join("disk.qcow2").exists() {
                return Err(ProviderError::NotFound(handle.to_string()));
            }
            self.ensure(handle, &dir).await?;
            let golden = store::named_version(&dir, GOLDEN_FILE);
            Ok(self.backend(handle, &dir, "adopted", golden))
        })
    }

    fn server_running(&self, handle: &str) -> Option<bool> {
        let dir = self.vm_dir(handle).ok()?;
        dir.exists().then(|| qemu::alive(&dir).is_some())
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let dir = self.vm_dir(handle)?;
            self.remove_vm(handle, &dir).await?;
            shared::collect(self).await;
            Ok(())
        })
    }

    fn stop<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let dir = self.vm_dir(handle)?;
            self.drop_bridge(handle);
            qemu::quit(&dir).await;
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for e in std::fs::read_dir(&self.vms)?.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if validate_handle(&name).is_err() {
                    continue;
                }
                let tag = tag_file::read(&e.path());
                out.push((name, tag));
            }
            Ok(out)
        })
    }

    fn secrets(&self) -> Vec<String> {
        vec![
            self.cfg.root.to_string_lossy().to_string(),
            SUPERUSER.to_string(),
        ]
    }

    fn retag<'a>(
        &'a self,
        handle: &'a str,
        tag: &'a BackendTag,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { tag_file::write(&self.vm_dir(handle)?, tag) })
    }

    fn session_target(&self, backend: &Backend, allow: Option<&[String]>) -> BackendTarget {
        let mut t = backend.target.clone();
        t.user = login_role(allow).to_string();
        t
    }

    fn superuser_logins(&self) -> Option<&dyn SuperuserLogin> {
        Some(self)
    }

    fn review_target(&self, backend: &Backend) -> BackendTarget {
        let mut t = backend.target.clone();
        t.user = REVIEWER.to_string();
        t
    }

    fn quiesce<'a>(&'a self, backend: &'a Backend) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let admin = self.superuser_target(backend);
            super::quiesce::whole_server(&admin).await.map(|_| ())
        })
    }

    fn reference<'a>(
        &'a self,
        golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let _g = self.reference_lock.lock().await;
            // Under the gate: the version is not removed while its reference is restored.
            let _gate = self.versions.read_gate().await;
            let snap = match golden {
                None => self.versions.active(),
                Some(id) => shared::find_golden(self, id)?,
            };
            let key = format!("{REFERENCE}{}", snap.id);
            let dir = self.refs.join(&snap.id);
            let running = qemu::alive(&dir).is_some()
                && self
                    .bridges
                    .lock()
                    .map(|m| m.contains_key(&key))
                    .unwrap_or(false);
            if !running {
                let _ = self.remove_vm(&key, &dir).await;
                std::fs::create_dir_all(&dir)?;
                if let Err(e) = self.restore(&key, &dir, &snap).await {
                    let _ = self.remove_vm(&key, &dir).await;
                    return Err(e);
                }
            }
            let mut b = self.backend(&key, &dir, "snapshot-restore", Some(snap.id.clone()));
            b.target.user = REVIEWER.to_string();
            Ok(b)
        })
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async move {
            let ids: Vec<String> = std::fs::read_dir(&self.refs)?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect();
            for id in ids {
                self.remove_reference(&id).await?;
            }
            Ok(())
        })
    }

    fn versions(&self) -> Option<&dyn GoldenVersions> {
        Some(self)
    }
}

impl SuperuserLogin for MicrovmProvider {
    /// The guest's own superuser: the VM has no network device and nothing of the host or
    /// of another clone inside it, so what a superuser can do (`COPY … TO PROGRAM`, files,
    /// untrusted languages, `ALTER SYSTEM`) stays in this throwaway machine.
    fn superuser_target(&self, backend: &Backend) -> BackendTarget {
        let mut t = backend.target.clone();
        t.user = SUPERUSER.to_string();
        t
    }
}

/// Builds (or finds) the guest image in `image_dir` now, so that a gateway started later
/// finds it cached (tests and CI build it once, up to [`image::BUILD_TIMEOUT`]).
pub async fn prepare_image(image_dir: &Path) -> Result<PathBuf, ProviderError> {
    image::ensure(None, image_dir).await.map(|i| i.dir)
}
