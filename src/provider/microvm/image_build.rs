//! The image build's child process: run in a mount namespace of its own (the `proc`, `sys`
//! and `dev` mounts debootstrap makes in the chroot are private to it and vanish with its
//! last process) and a process group of its own, and ended with everything it started when
//! the build is dropped (gateway shutdown, timeout) or finishes.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::pg::process;
use crate::provider::ProviderError;

/// A running build script; dropping it kills every process of the build.
pub(super) struct BuildChild {
    child: tokio::process::Child,
    pid: i32,
    /// `/proc/<pid>/ns/mnt` of the build (e.g. `mnt:[4026532290]`), when it differs from ours.
    mount_ns: Option<PathBuf>,
}

impl BuildChild {
    /// Starts `sh script args…` with stdout and stderr to `log`, in a new session (its own
    /// process group) and a new mount namespace whose mounts do not propagate back. Needs
    /// CAP_SYS_ADMIN (the image build needs root anyway).
    pub(super) fn spawn(script: &Path, args: &[&Path], log: &Path) -> Result<Self, ProviderError> {
        let log = std::fs::File::create(log)?;
        let mut cmd = std::process::Command::new("sh");
        cmd.arg(script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: the closure only makes async-signal-safe system calls and allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::unshare(libc::CLONE_NEWNS) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // Private, recursively: nothing mounted inside shows outside (or stays after).
                let root = c"/";
                if libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == -1
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = tokio::process::Command::from(cmd)
            .spawn()
            .map_err(ProviderError::golden_io("running the image script"))?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        // The child has exec'd (spawn waits for that), so its namespace is the new one.
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
        let mount_ns = ns(&pid.to_string()).filter(|n| Some(n) != ns("self").as_ref());
        Ok(BuildChild {
            child,
            pid,
            mount_ns,
        })
    }

    /// Pid of the script (the leader of the build's process group).
    pub(super) fn pid(&self) -> i32 {
        self.pid
    }

    /// Writes the script's pid to `file`: a gateway killed during the build cannot end it
    /// (no drop runs), so the next start finds it there ([`end_leftover`]).
    pub(super) fn record(&self, file: &Path) -> std::io::Result<()> {
        std::fs::write(file, format!("{}\n", self.pid))
    }

    /// The build's mount namespace (`mnt:[inode]`), if it got its own.
    #[cfg(test)]
    pub(super) fn mount_ns(&self) -> Option<&Path> {
        self.mount_ns.as_deref()
    }

    /// Waits for the script, up to `limit` (None when it took longer; the drop ends it).
    pub(super) async fn wait(&mut self, limit: Duration) -> Option<std::io::Result<ExitStatus>> {
        tokio::time::timeout(limit, self.child.wait()).await.ok()
    }
}

impl Drop for BuildChild {
    fn drop(&mut self) {
        // The group while its leader is unreaped (its pid cannot be reused until then)…
        if matches!(self.child.try_wait(), Ok(None)) {
            process::signal_group(self.pid, Signal::SIGKILL);
            let _ = self.child.start_kill();
        }
        // …and whatever else lives in the build's namespace (a daemon a package's postinst
        // started in the chroot leaves the group): once none is left, its mounts are gone.
        if let Some(ns) = &self.mount_ns {
            for pid in in_namespace(ns) {
                process::signal(pid, Signal::SIGKILL);
            }
        }
    }
}

/// How long the processes of a leftover build get to go after SIGKILL.
const LEFTOVER_GRACE: Duration = Duration::from_secs(30);

/// Ends the build a killed gateway left running, named by `pid_file` (see
/// [`BuildChild::record`]): only if that pid still runs a command line naming `script_name`
/// (a pid is reused). Every process in its mount namespace (when not ours) and its process
/// group is killed, and waited for (bounded). Returns how many processes were signalled.
pub(super) async fn end_leftover(pid_file: &Path, script_name: &str) -> usize {
    let pid = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok());
    let _ = std::fs::remove_file(pid_file);
    let Some(pid) = pid.filter(|&p| process::pid_alive(p)) else {
        return 0;
    };
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmd).contains(script_name) {
        return 0;
    }
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
    let theirs = ns(&pid.to_string()).filter(|n| Some(n) != ns("self").as_ref());
    let mut victims = theirs.as_deref().map(in_namespace).unwrap_or_default();
    victims.push(pid);
    tracing::warn!(
        pid,
        processes = victims.len(),
        "ending a guest image build a killed gateway left running"
    );
    process::signal_group(pid, Signal::SIGKILL);
    for p in &victims {
        process::signal(*p, Signal::SIGKILL);
    }
    let deadline = std::time::Instant::now() + LEFTOVER_GRACE;
    while victims.iter().any(|&p| process::pid_alive(p)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    victims.len()
}

/// Pids of the processes whose mount namespace is `ns`.
pub(super) fn in_namespace(ns: &Path) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/mnt")).is_ok_and(|n| n == ns))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build script that mounts `proc` and a tmpfs where debootstrap would (under its
    /// work dir), starts a daemon that leaves its process group, then works "forever".
    const SCRIPT: &str = "set -eu\n\
        mkdir -p \"$1/root/proc\" \"$1/root/tmp\"\n\
        mount -t proc proc \"$1/root/proc\"\n\
        mount -t tmpfs tmpfs \"$1/root/tmp\"\n\
        setsid sleep 3600 </dev/null >/dev/null 2>&1 &\n\
        echo $! >\"$1/daemon.pid\"\n\
        touch \"$1/mounted\"\n\
        sleep 3600\n";

    fn root_or_skip() -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: the image build test needs root (a mount namespace)"
        );
        eprintln!("skipped: the image build runs as root (mount namespace); not root here");
        false
    }

    fn mounted_here(under: &Path) -> bool {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|m| Path::new(m).starts_with(under))
    }

    #[tokio::test]
    async fn a_dropped_build_takes_its_processes_and_mounts_with_it() {
        if !root_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("mkdir");
        let script = dir.path().join("build.sh");
        std::fs::write(&script, SCRIPT).expect("script");
        let log = dir.path().join("build.log");
        let child = BuildChild::spawn(&script, &[&work], &log).expect("spawn");
        let (pid, ns) = (child.pid(), child.mount_ns().map(Path::to_path_buf));
        let ns = ns.expect("the build has a mount namespace of its own");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !work.join("mounted").exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "script did not get to its mounts: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let daemon: i32 = std::fs::read_to_string(work.join("daemon.pid"))
            .expect("daemon pid")
            .trim()
            .parse()
            .expect("pid");
        // The mounts exist in the build's namespace only.
        let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mounts");
        assert!(
            theirs.contains(&*work.join("root/proc").to_string_lossy()),
            "{theirs}"
        );
        assert!(
            !mounted_here(&work),
            "a build mount leaked into the host namespace"
        );
        assert!(process::pid_alive(daemon));
        assert!(in_namespace(&ns).len() >= 3, "script, sleep, daemon");

        // What a gateway shutdown (or the timeout) does: the build future is dropped.
        drop(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !in_namespace(&ns).is_empty() || process::pid_alive(daemon) {
            assert!(
                std::time::Instant::now() < deadline,
                "build processes left: {:?}",
                in_namespace(&ns)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Nothing was ever mounted here, so removing the work dir touches only its own files.
        assert!(!mounted_here(&work));
        std::fs::remove_dir_all(&work).expect("rm -rf the build's work dir");
    }

    #[tokio::test]
    async fn a_build_left_by_a_killed_gateway_is_ended_by_the_next_start() {
        if !root_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("mkdir");
        let script = dir.path().join("microvm-image.sh");
        std::fs::write(&script, SCRIPT).expect("script");
        let child =
            BuildChild::spawn(&script, &[&work], &dir.path().join("build.log")).expect("spawn");
        let pid_file = dir.path().join("build.pid");
        child.record(&pid_file).expect("record");
        let ns = child
            .mount_ns()
            .map(Path::to_path_buf)
            .expect("own namespace");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !work.join("mounted").exists() {
            assert!(std::time::Instant::now() < deadline, "script did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A SIGKILLed gateway runs no drop: the build goes on without it.
        std::mem::forget(child);
        assert!(!in_namespace(&ns).is_empty());
        // A pid file naming something else is not acted on.
        let other = dir.path().join("other.pid");
        std::fs::write(&other, format!("{}\n", std::process::id())).expect("write");
        assert_eq!(end_leftover(&other, "microvm-image.sh").await, 0);

        assert!(end_leftover(&pid_file, "microvm-image.sh").await >= 3);
        // SIGKILLed processes leave the namespace when the kernel has torn them down, which
        // on a loaded machine can trail the kill by a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !in_namespace(&ns).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(in_namespace(&ns).is_empty(), "{:?}", in_namespace(&ns));
        assert!(!pid_file.exists());
        assert!(!mounted_here(&work));
    }
}
