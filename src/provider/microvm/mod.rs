//! The `microvm` provider: each scratch database is its own QEMU virtual machine, restored
//! from a memory snapshot of a running golden VM (VM templating: the golden's RAM is a shared
//! file; each clone maps it privately, copy-on-write, and gets its own qcow2 overlay). The
//! guest has no network device; the gateway reaches its Postgres through a unix socket
//! bridged over one virtio-serial port ([`bridge`]).

mod accel;
mod bridge;
mod golden;
mod image;
mod qemu;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

use self::bridge::Bridge;
use self::qemu::{Image, Qmp, VmSpec};
use super::golden::{login_role, AGENT, DATABASE, REVIEWER, SUPERUSER};
use super::tag_file;
use super::{Backend, BackendTag, BoxFuture, Provider, ProviderError};
use crate::pg::process;
use crate::pgconn::{BackendTarget, Endpoint};

pub use image::recipe_hash;

/// Tag file in a VM dir.
/// Which golden a clone was restored from.
const GOLDEN_FILE: &str = "golden";
/// Dir name of the review's reference clone (under `refs/`, never listed).
const REFERENCE: &str = "reference";

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
    golden: golden::Snapshot,
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
        let golden = golden::ensure(&cfg, &image).await?;
        Ok(MicrovmProvider {
            cfg,
            image,
            golden,
            vms,
            refs,
            bridges: Mutex::new(HashMap::new()),
            reference_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// The golden snapshot's id.
    pub fn golden_id(&self) -> &str {
        &self.golden.id
    }

    fn vm_dir(&self, handle: &str) -> Result<PathBuf, ProviderError> {
        validate_handle(handle)?;
        Ok(self.vms.join(handle))
    }

    fn backend(&self, handle: &str, dir: &Path, method: &str) -> Backend {
        Backend {
            handle: handle.to_string(),
            target: BackendTarget {
                endpoint: Endpoint::unix(process::socket_path(dir)),
                user: AGENT.to_string(),
                database: DATABASE.to_string(),
                password: None,
            },
            method: method.to_string(),
            // No network device at all: stronger than an empty namespace.
            netns: true,
            // No golden versions here (one snapshot per SQL file, image and VM shape); the
            // dir's `golden` file records which snapshot a clone came from.
            golden: None,
        }
    }

    fn spec<'a>(
        &'a self,
        dir: &'a Path,
        disk: &'a Path,
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
            mem: &self.golden.mem,
            shared: false,
            incoming,
            name,
        }
    }

    /// Restores a clone of the golden into `dir` (which holds nothing but what the caller
    /// wrote) and starts its bridge.
    async fn restore(&self, handle: &str, dir: &Path) -> Result<(), ProviderError> {
        let t0 = Instant::now();
        let disk = dir.join("disk.qcow2");
        qemu::overlay(&self.golden.disk, &disk).await?;
        std::fs::write(dir.join(GOLDEN_FILE), &self.golden.id)?;
        let name = format!("sandpit-vm-{handle}");
        qemu::start(&self.spec(dir, &disk, &name, true))?;
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
        let uri = format!("file:{}", self.golden.state.display());
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
        qemu::start(&self.spec(dir, &disk, &name, false))?;
        let deadline = self.cfg.boot_timeout;
        let chan = bridge::connect_channel(&dir.join(qemu::CHANNEL), deadline).await?;
        let b = Bridge::start(chan, &process::socket_path(dir))?;
        b.ping(deadline).await?;
        b.set_clock().await?;
        golden::wait_postgres(&self.golden.psql, dir, deadline).await?;
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
            if let Err(e) = self.restore(&handle, &dir).await {
                let log = std::fs::read_to_string(dir.join("qemu.log")).unwrap_or_default();
                let _ = self.remove_vm(&handle, &dir).await;
                return Err(ProviderError::Fork(format!(
                    "{e}; qemu: {}",
                    super::golden::tail(&log)
                )));
            }
            Ok(self.backend(&handle, &dir, "snapshot-restore"))
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
            Ok(self.backend(handle, &dir, "adopted"))
        })
    }

    fn server_running(&self, handle: &str) -> Option<bool> {
        let dir = self.vm_dir(handle).ok()?;
        dir.exists().then(|| qemu::alive(&dir).is_some())
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let dir = self.vm_dir(handle)?;
            self.remove_vm(handle, &dir).await
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

    fn superuser_sessions(&self) -> bool {
        true
    }

    /// The guest's own superuser: the VM has no network device and nothing of the host or
    /// of another clone inside it, so what a superuser can do (`COPY … TO PROGRAM`, files,
    /// untrusted languages, `ALTER SYSTEM`) stays in this throwaway machine.
    fn superuser_target(&self, backend: &Backend) -> Option<BackendTarget> {
        let mut t = backend.target.clone();
        t.user = SUPERUSER.to_string();
        Some(t)
    }

    fn review_target(&self, backend: &Backend) -> BackendTarget {
        let mut t = backend.target.clone();
        t.user = REVIEWER.to_string();
        t
    }

    fn reference<'a>(
        &'a self,
        _golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let _g = self.reference_lock.lock().await;
            let dir = self.refs.join(REFERENCE);
            let running = qemu::alive(&dir).is_some()
                && self
                    .bridges
                    .lock()
                    .map(|m| m.contains_key(REFERENCE))
                    .unwrap_or(false);
            if !running {
                let _ = self.remove_vm(REFERENCE, &dir).await;
                std::fs::create_dir_all(&dir)?;
                if let Err(e) = self.restore(REFERENCE, &dir).await {
                    let _ = self.remove_vm(REFERENCE, &dir).await;
                    return Err(e);
                }
            }
            let mut b = self.backend(REFERENCE, &dir, "snapshot-restore");
            b.target.user = REVIEWER.to_string();
            Ok(b)
        })
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async move {
            let dir = self.refs.join(REFERENCE);
            self.remove_vm(REFERENCE, &dir).await
        })
    }
}

/// Builds (or finds) the guest image in `image_dir` now, so that a gateway started later
/// finds it cached (tests and CI build it once, up to [`image::BUILD_TIMEOUT`]).
pub async fn prepare_image(image_dir: &Path) -> Result<PathBuf, ProviderError> {
    image::ensure(None, image_dir).await.map(|i| i.dir)
}
