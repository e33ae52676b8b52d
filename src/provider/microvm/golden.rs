//! The golden VM: booted once from the image, the golden database built inside it from the
//! configured SQL, checkpointed, then its memory and device state saved (VM templating: the
//! RAM is already in a shared file, so the migration stream holds only device state).
//! Golden versions from a live database are made the same way, the database copied in
//! from the live source instead of built from the SQL file.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};

use super::bridge::{self, Bridge};
use super::qemu::{self, Image, Qmp, VmSpec};
use super::MicrovmConfig;
use crate::pg::process;
use crate::provider::golden::live::{BuildReport, LiveSpec, SourceDsn};
use crate::provider::golden::versions::Version;
use crate::provider::golden::DATABASE;
use crate::provider::golden::{GoldenCtx, Load, SUPERUSER};
use crate::provider::ProviderError;

/// Bump when the way the golden VM is made changes.
const FORMAT: &str = "sandpit-microvm-golden-v1";
/// Written last into a finished golden.
const READY: &str = "ready";
/// In a built version's dir: the VM shape ([`shape`]) it was snapshotted with.
const SHAPE: &str = "shape";

/// A finished golden snapshot.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its id (hash of what went into it).
    pub id: String,
    /// The RAM file (clones map it privately).
    pub mem: PathBuf,
    /// Device state (migration stream without RAM).
    pub state: PathBuf,
    /// Its disk, backing file of every clone's overlay.
    pub disk: PathBuf,
    /// Host `psql`, for readiness checks.
    pub psql: PathBuf,
}

impl Snapshot {
    /// The snapshot `id` whose files are in `dir`.
    pub fn at(id: &str, dir: &Path, psql: &Path) -> Snapshot {
        Snapshot {
            id: id.to_string(),
            mem: dir.join("mem"),
            state: dir.join("state"),
            disk: dir.join("disk.qcow2"),
            psql: psql.to_path_buf(),
        }
    }
}

impl Version for Snapshot {
    fn id(&self) -> &str {
        &self.id
    }
}

/// What a snapshot restores only with: the image, the way goldens are made, and the VM's
/// memory, vCPUs and accelerator.
pub fn shape(cfg: &MicrovmConfig, image: &Image) -> String {
    let mut h = Sha256::new();
    h.update(image.dir.to_string_lossy().as_bytes());
    h.update(format!("{FORMAT} {} {} {}", cfg.memory_mib, cfg.vcpus, cfg.accel).as_bytes());
    hex::encode(h.finalize())[..16].to_string()
}

/// In a masked build's dir: the staging VM's dir ([`build_live`]).
pub const STAGE_DIR: &str = "stage";

/// Dir of base goldens (one per SQL content, image and VM shape), under the root.
pub const GOLDENS_DIR: &str = "goldens";

/// Whether `dir` holds a finished base golden (its id holds its shape).
pub fn base_ready(dir: &Path) -> bool {
    dir.join(READY).exists()
}

/// Whether `dir` holds a finished built version of this `shape`.
pub fn version_ready(dir: &Path, shape: &str) -> bool {
    dir.join(READY).exists()
        && std::fs::read_to_string(dir.join(SHAPE)).is_ok_and(|s| s.trim() == shape)
}

/// Builds a version from a live database into `tmp` (a fresh dir): a golden VM booted from
/// the image, the source copied in (masked and sampled as `spec` says), checkpointed, then
/// snapshotted. The VM is gone when this returns.
pub async fn build_live(
    cfg: &MicrovmConfig,
    image: &Image,
    tmp: &Path,
    spec: &LiveSpec,
) -> Result<BuildReport, ProviderError> {
    std::fs::create_dir_all(tmp)?;
    let bins = crate::pg::find_binaries(cfg.bin_dir.as_deref())?;
    let snap = Snapshot::at("building", tmp, &bins.psql);
    let report = if spec.mask.columns.is_empty() && spec.mask.samples.is_empty() {
        build_or_explain(cfg, image, tmp, &snap, &bins, Load::Live(spec)).await?
    } else {
        Some(build_masked(cfg, image, tmp, &snap, &bins, spec).await?)
    };
    std::fs::write(tmp.join(SHAPE), format!("{}\n", shape(cfg, image)))?;
    std::fs::write(tmp.join(READY), format!("{FORMAT}\n"))?;
    report.ok_or_else(|| ProviderError::Golden("live build gave no report".into()))
}

/// A masked or sampled build in two VMs: the source is copied and masked in a staging VM,
/// whose memory and disk keep original values (the restore's pages, freed blocks, WAL),
/// then only the masked database is dumped from it into the golden VM that is
/// snapshotted. The staging VM and its files are removed.
async fn build_masked(
    cfg: &MicrovmConfig,
    image: &Image,
    tmp: &Path,
    snap: &Snapshot,
    bins: &crate::pg::PgBinaries,
    spec: &LiveSpec,
) -> Result<BuildReport, ProviderError> {
    let stage = tmp.join(STAGE_DIR);
    std::fs::create_dir_all(&stage)?;
    let r = async {
        let vm = (
            stage.join("disk.qcow2"),
            stage.join("mem"),
            "sandpit-vm-golden-stage",
        );
        let (bridge, report) = boot_and_fill(
            cfg,
            image,
            &stage,
            (&vm.0, &vm.1, vm.2),
            bins,
            Load::Live(spec),
        )
        .await?;
        let report =
            report.ok_or_else(|| ProviderError::Golden("staging build gave no report".into()))?;
        let escaped = stage
            .to_string_lossy()
            .replace('\\', "\\\\")
            .replace('\'', "\\'");
        let staged = LiveSpec {
            source: SourceDsn::parse(&format!(
                "host='{escaped}' port={} user={SUPERUSER} dbname={DATABASE}",
                process::PORT
            ))?,
            schemas: Vec::new(),
            exclude_tables: Vec::new(),
            mask: Default::default(),
            id: None,
            mask_text: None,
        };
        build_or_explain(cfg, image, tmp, snap, bins, Load::Live(&staged)).await?;
        drop(bridge);
        Ok(report)
    }
    .await;
    qemu::kill(&stage).await;
    let _ = std::fs::remove_dir_all(&stage);
    r
}

/// Runs [`build`], always ends its VM, and puts the VM's last words in a failure.
async fn build_or_explain(
    cfg: &MicrovmConfig,
    image: &Image,
    dir: &Path,
    snap: &Snapshot,
    bins: &crate::pg::PgBinaries,
    what: Load<'_>,
) -> Result<Option<BuildReport>, ProviderError> {
    let r = build(cfg, image, dir, snap, bins, what).await;
    qemu::kill(dir).await;
    r.map_err(|e| {
        let console = std::fs::read_to_string(dir.join(qemu::CONSOLE)).unwrap_or_default();
        let log = std::fs::read_to_string(dir.join("qemu.log")).unwrap_or_default();
        match e {
            // A refused request (bad masking rules) says what is wrong, nothing else.
            ProviderError::Invalid(_) | ProviderError::InvalidMask(_) => e,
            e => ProviderError::Golden(format!(
                "golden VM: {e}; qemu: {}; console: {}",
                crate::provider::golden::tail(&log),
                crate::provider::golden::tail(&console)
            )),
        }
    })
}

/// The golden for this SQL, image and VM shape: found, or built now.
pub async fn ensure(cfg: &MicrovmConfig, image: &Image) -> Result<Snapshot, ProviderError> {
    let sql = std::fs::read(&cfg.golden_sql).map_err(ProviderError::golden_io(format!(
        "reading {}",
        cfg.golden_sql.display()
    )))?;
    let mut h = Sha256::new();
    h.update(&sql);
    h.update(image.dir.to_string_lossy().as_bytes());
    h.update(format!("{FORMAT} {} {} {}", cfg.memory_mib, cfg.vcpus, cfg.accel).as_bytes());
    let id = format!("golden-{}", &hex::encode(h.finalize())[..16]);
    let dir = cfg.root.join(GOLDENS_DIR).join(&id);
    let bins = crate::pg::find_binaries(cfg.bin_dir.as_deref())?;
    let snap = Snapshot::at(&id, &dir, &bins.psql);
    if dir.join(READY).exists() {
        return Ok(snap);
    }
    if dir.exists() {
        qemu::kill(&dir).await;
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    let t0 = Instant::now();
    build_or_explain(cfg, image, &dir, &snap, &bins, Load::Sql(&cfg.golden_sql)).await?;
    std::fs::write(dir.join(READY), format!("{FORMAT}\n"))?;
    tracing::info!(golden = %id, seconds = t0.elapsed().as_secs(), "microvm golden snapshot taken");
    Ok(snap)
}

/// Boots a golden VM into `dir`, its disk an overlay of the image, its RAM the shared
/// file `mem`, and fills its database; the VM keeps running (with the returned bridge).
async fn boot_and_fill(
    cfg: &MicrovmConfig,
    image: &Image,
    dir: &Path,
    (disk, mem, name): (&Path, &Path, &str),
    bins: &crate::pg::PgBinaries,
    what: Load<'_>,
) -> Result<(Bridge, Option<BuildReport>), ProviderError> {
    qemu::overlay(&image.dir.join("root.qcow2"), disk).await?;
    let spec = VmSpec {
        qemu: &cfg.qemu,
        accel: &cfg.accel,
        memory_mib: cfg.memory_mib,
        vcpus: cfg.vcpus,
        image,
        dir,
        disk,
        mem,
        shared: true,
        incoming: false,
        name,
    };
    qemu::start(&spec)?;
    let deadline = cfg.boot_timeout;
    let chan = bridge::connect_channel(&dir.join(qemu::CHANNEL), deadline).await?;
    let b = Bridge::start(chan, &process::socket_path(dir))?;
    b.ping(deadline).await?;
    b.set_clock().await?;
    wait_postgres(&bins.psql, dir, deadline).await?;
    // Roles, database and the golden SQL, exactly as the instance provider's golden.
    let run_as = crate::pg::user::resolve(None)?;
    let ctx = GoldenCtx {
        bins,
        run_as: &run_as,
        netns: false,
        root: dir,
        sql_path: &cfg.golden_sql,
        gateway_user: SUPERUSER,
        max_connections: 20,
    };
    let report = match what {
        Load::Sql(sql) => {
            crate::provider::golden::build::load(&ctx, dir, sql).await?;
            None
        }
        // The same dump, masking, VACUUM FULL and checkpoint as the instance provider's
        // live build, through the VM's bridge socket.
        Load::Live(spec) => Some(crate::provider::golden::live::load(&ctx, dir, spec).await?),
    };
    Ok((b, report))
}

/// Boots the golden VM, fills it, and saves its snapshot into `snap`'s files.
async fn build(
    cfg: &MicrovmConfig,
    image: &Image,
    dir: &Path,
    snap: &Snapshot,
    bins: &crate::pg::PgBinaries,
    what: Load<'_>,
) -> Result<Option<BuildReport>, ProviderError> {
    let vm = (snap.disk.as_path(), snap.mem.as_path(), "sandpit-vm-golden");
    let (b, report) = boot_and_fill(cfg, image, dir, vm, bins, what).await?;
    let deadline = cfg.boot_timeout;
    let mut qmp = Qmp::connect(&dir.join(qemu::QMP), deadline).await?;
    qmp.execute(
        "migrate-set-capabilities",
        json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]}),
    )
    .await?;
    let uri = format!("file:{}", snap.state.display());
    qmp.execute("migrate", json!({ "uri": uri })).await?;
    qmp.wait_migration(deadline).await?;
    let _ = qmp.execute("quit", json!({})).await;
    drop(b);
    Ok(report)
}

/// Waits until the guest's Postgres answers `select 1` through the bridge socket in `dir`.
pub async fn wait_postgres(
    psql: &Path,
    dir: &Path,
    deadline: Duration,
) -> Result<(), ProviderError> {
    let start = Instant::now();
    loop {
        let out = crate::provider::golden::psql::psql_command(psql, dir, SUPERUSER, "postgres")
            .args(["-c", "select 1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .await
            .map_err(ProviderError::golden_io("running psql"))?;
        if out.status.success() {
            return Ok(());
        }
        if start.elapsed() > deadline {
            return Err(ProviderError::NotReady(format!(
                "guest Postgres not ready within {deadline:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
