//! Starting QEMU for a golden or a clone, and the little of QMP the provider needs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::provider::ProviderError;

/// The guest image files (see scripts/microvm-image.sh).
#[derive(Debug, Clone)]
pub struct Image {
    /// Directory holding vmlinuz, initrd.img, root.qcow2.
    pub dir: PathBuf,
}

/// What one VM is started with.
pub struct VmSpec<'a> {
    /// The hypervisor binary.
    pub qemu: &'a Path,
    /// `-accel` value: "kvm" or "tcg".
    pub accel: &'a str,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// vCPUs.
    pub vcpus: u32,
    /// The image (kernel, initrd).
    pub image: &'a Image,
    /// The VM's own dir: channel, QMP socket, pid file, console log.
    pub dir: &'a Path,
    /// Its disk (a qcow2 overlay).
    pub disk: &'a Path,
    /// The memory file; `shared` maps it shared (the golden writes it), else private
    /// copy-on-write (a clone).
    pub mem: &'a Path,
    /// Whether the memory file is shared (the golden) or a private COW mapping (clones).
    pub shared: bool,
    /// Restore from a migration stream (`-incoming defer`) instead of booting.
    pub incoming: bool,
    /// A name for `ps` and the janitor.
    pub name: &'a str,
}

/// File names inside a VM dir.
pub const CHANNEL: &str = "chan.sock";
/// QMP socket.
pub const QMP: &str = "qmp.sock";
/// QEMU's pid file.
pub const PIDFILE: &str = "qemu.pid";
/// Serial console output.
pub const CONSOLE: &str = "console.log";

/// Creates a qcow2 overlay of `backing`.
pub async fn overlay(backing: &Path, disk: &Path) -> Result<(), ProviderError> {
    let out = tokio::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(backing)
        .arg(disk)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| ProviderError::ForkIo {
            what: "qemu-img".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(ProviderError::Fork(format!(
            "qemu-img create: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Starts QEMU daemonized-like (own process group, not a child we must wait for); returns its pid.
pub fn start(spec: &VmSpec<'_>) -> Result<u32, ProviderError> {
    let d = spec.dir;
    let mem = format!(
        "memory-backend-file,id=mem,size={}M,mem-path={},share={}{}",
        spec.memory_mib,
        spec.mem.display(),
        if spec.shared { "on" } else { "off" },
        if spec.shared {
            ""
        } else {
            ",readonly=on,rom=off"
        }
    );
    let mut cmd = std::process::Command::new(spec.qemu);
    cmd.args(["-name", spec.name, "-nodefaults", "-no-user-config"])
        .args(["-machine", "q35,memory-backend=mem"])
        // TCG's translated-code cache is private to each process: 64 MiB instead of the
        // default 1 GiB bounds what an idle clone can grow to.
        .args([
            "-accel",
            if spec.accel == "tcg" {
                "tcg,tb-size=64"
            } else {
                spec.accel
            },
        ])
        .args(["-m", &format!("{}M", spec.memory_mib)])
        .args(["-smp", &spec.vcpus.to_string()])
        .args(["-object", &mem])
        .arg("-kernel")
        .arg(spec.image.dir.join("vmlinuz"))
        .arg("-initrd")
        .arg(spec.image.dir.join("initrd.img"))
        .args([
            "-append",
            "console=ttyS0 root=/dev/vda rw init=/sbin/sandpit-init quiet panic=-1",
        ])
        .args([
            "-drive",
            &format!(
                "file={},if=none,id=disk0,format=qcow2,cache=unsafe",
                spec.disk.display()
            ),
        ])
        .args(["-device", "virtio-blk-pci,drive=disk0"])
        .args(["-device", "virtio-serial-pci,id=vser0"])
        .args([
            "-chardev",
            &format!(
                "socket,id=ch0,path={},server=on,wait=on",
                d.join(CHANNEL).display()
            ),
        ])
        .args(["-device", "virtserialport,chardev=ch0,name=sandpit"])
        // A new generation id at every start: the guest kernel reseeds its RNG on restore.
        .args(["-device", "vmgenid,guid=auto"])
        // No network device at all (-nodefaults leaves none; say so for the reader).
        .args(["-nic", "none"])
        .args(["-display", "none", "-monitor", "none"])
        .args(["-serial", &format!("file:{}", d.join(CONSOLE).display())])
        .args([
            "-qmp",
            &format!("unix:{},server=on,wait=off", d.join(QMP).display()),
        ])
        .arg("-pidfile")
        .arg(d.join(PIDFILE));
    if spec.incoming {
        cmd.args(["-incoming", "defer"]);
    }
    let log = std::fs::File::create(d.join("qemu.log"))?;
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Its own process group: a signal to the gateway's group does not reach the VM, and the
    // VM outlives a gateway restart (ensure_running adopts it).
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().map_err(|source| ProviderError::ForkIo {
        what: format!("starting {}", spec.qemu.display()),
        source,
    })?;
    let pid = child.id();
    // Reaped by a detached thread so it never lingers as a zombie.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(pid)
}

/// The pid of the QEMU running the VM in `dir`, if it runs (its pid file names a live process
/// whose command line has this VM's channel path).
pub fn alive(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join(PIDFILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let marker = dir.join(CHANNEL);
    let needle = marker.to_string_lossy();
    String::from_utf8_lossy(&cmdline)
        .contains(needle.as_ref())
        .then_some(pid)
}

/// Kills the VM in `dir`, if it runs, and waits (bounded) for it to go.
pub async fn kill(dir: &Path) {
    if let Some(pid) = alive(dir) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Ends the VM in `dir` cleanly (QMP `quit`: QEMU flushes its disk caches, so the overlay
/// is consistent for a later cold boot), else kills it.
pub async fn quit(dir: &Path) {
    let Some(pid) = alive(dir) else { return };
    if let Ok(Ok(mut q)) = tokio::time::timeout(
        Duration::from_secs(5),
        Qmp::connect(&dir.join(QMP), Duration::from_secs(2)),
    )
    .await
    {
        let _ = tokio::time::timeout(Duration::from_secs(5), q.execute("quit", json!({}))).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && Path::new(&format!("/proc/{pid}")).exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    kill(dir).await;
}

/// A QMP connection.
pub struct Qmp {
    rd: BufReader<tokio::net::unix::OwnedReadHalf>,
    wr: tokio::net::unix::OwnedWriteHalf,
}

impl Qmp {
    /// Connects (waiting up to `deadline` for the socket) and leaves capabilities negotiation.
    pub async fn connect(path: &Path, deadline: Duration) -> Result<Qmp, ProviderError> {
        let start = Instant::now();
        let s = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(source) if start.elapsed() > deadline => {
                    return Err(ProviderError::NotReadyIo {
                        what: "qmp".into(),
                        source,
                    })
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let (rd, wr) = s.into_split();
        let mut q = Qmp {
            rd: BufReader::new(rd),
            wr,
        };
        q.read_value().await?; // greeting
        q.execute("qmp_capabilities", json!({})).await?;
        Ok(q)
    }

    async fn read_value(&mut self) -> Result<Value, ProviderError> {
        let mut line = String::new();
        // QMP messages are single lines; a bound keeps a broken peer from growing it forever.
        let n = (&mut self.rd)
            .take(1 << 20)
            .read_line(&mut line)
            .await
            .map_err(ProviderError::io_at("qmp read"))?;
        if n == 0 {
            return Err(ProviderError::Other("qmp: connection closed".into()));
        }
        serde_json::from_str(&line).map_err(|source| ProviderError::Json {
            what: "qmp json".into(),
            source,
        })
    }

    /// Runs one command, skipping events, and returns its `return` value.
    pub async fn execute(&mut self, cmd: &str, args: Value) -> Result<Value, ProviderError> {
        let mut msg =
            serde_json::to_vec(&json!({"execute": cmd, "arguments": args})).map_err(|source| {
                ProviderError::Json {
                    what: "qmp json".into(),
                    source,
                }
            })?;
        msg.push(b'\n');
        self.wr
            .write_all(&msg)
            .await
            .map_err(ProviderError::io_at("qmp write"))?;
        loop {
            let v = self.read_value().await?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(ProviderError::Other(format!("qmp {cmd}: {e}")));
            }
        }
    }

    /// Polls `query-migrate` until the migration completes (or fails, or `deadline`).
    pub async fn wait_migration(&mut self, deadline: Duration) -> Result<(), ProviderError> {
        let start = Instant::now();
        loop {
            let r = self.execute("query-migrate", json!({})).await?;
            match r.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some("failed") | Some("cancelled") => {
                    return Err(ProviderError::Other(format!("migration failed: {r}")))
                }
                _ if start.elapsed() > deadline => {
                    return Err(ProviderError::NotReady(format!(
                        "migration not done within {deadline:?}: {r}"
                    )))
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Polls `query-status` until the VM runs.
    pub async fn wait_running(&mut self, deadline: Duration) -> Result<(), ProviderError> {
        let start = Instant::now();
        loop {
            let r = self.execute("query-status", json!({})).await?;
            if r.get("status").and_then(Value::as_str) == Some("running") {
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err(ProviderError::NotReady(format!(
                    "VM not running within {deadline:?}: {r}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
