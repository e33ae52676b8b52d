//! Spawning PostgreSQL programs as the unprivileged user, in their own session and (optionally)
//! an empty network namespace; readiness via `postmaster.pid`; signals and waiting for exit.

use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::Child;

use super::user::RunAs;
use super::PgBinaries;
use crate::pg::PgError;

/// Port every instance uses; instances differ by socket directory, not port.
pub const PORT: u16 = 5432;
/// Name of the socket file inside the socket directory.
pub const SOCKET_FILE: &str = ".s.PGSQL.5432";
/// How long a server may take to report `ready`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval for readiness and exit; short because a fork's latency is the product.
const POLL: Duration = Duration::from_millis(3);
/// PATH for children: an empty environment keeps the gateway's secrets (admin key, …) away
/// from anything a superuser could run inside Postgres.
const CHILD_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A std `Command` for `program` that, in the child, starts a new session (so a Ctrl-C on the
/// gateway's terminal does not reach Postgres), optionally enters a fresh network namespace,
/// and drops to `run_as`. Everything happens in one `pre_exec`, because std's `uid()`/`gid()`
/// would drop privileges before `unshare` could run.
pub fn command(program: &Path, run_as: &RunAs, netns: bool) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .env("PATH", CHILD_PATH)
        .current_dir("/")
        .stdin(Stdio::null());
    let (switch, uid, gid) = (run_as.switch, run_as.uid, run_as.gid);
    // SAFETY: the closure only calls async-signal-safe libc functions and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            if netns && libc::unshare(libc::CLONE_NEWNET) == -1 {
                return Err(io::Error::last_os_error());
            }
            if switch {
                if libc::setgroups(0, std::ptr::null()) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::setgid(gid) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::setuid(uid) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd
}

/// Whether children can be started in an empty network namespace: only when we are root, and
/// only if the kernel/container lets us (probed by running `postgres --version` that way, which
/// also proves the user can execute the server binary).
pub fn probe_netns(bins: &PgBinaries, run_as: &RunAs) -> bool {
    if !run_as.switch {
        return false;
    }
    let mut cmd = command(&bins.postgres, run_as, true);
    cmd.arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match cmd.status() {
        Ok(s) if s.success() => true,
        Ok(s) => {
            tracing::warn!(status = %s, "postgres --version failed inside a network namespace; not using netns");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot create network namespaces; instances will share the host network");
            false
        }
    }
}

/// What `postmaster.pid` says.
#[derive(Debug, Clone)]
pub struct PidFile {
    /// Postmaster pid (line 1).
    pub pid: i32,
    /// Status (line 8): "starting", "ready", "stopping", … (empty on old servers).
    pub status: String,
}

/// Reads `<data>/postmaster.pid`; None if absent or unparsable.
pub fn read_pid_file(data: &Path) -> Option<PidFile> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let mut lines = text.lines();
    let pid = lines.next()?.trim().parse::<i32>().ok()?;
    let status = text.lines().nth(7).unwrap_or("").trim().to_string();
    Some(PidFile { pid, status })
}

/// Whether `pid` is a live (non-zombie) process.
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 || kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    // A zombie still answers kill(0); it is gone for our purposes.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

/// Whether `pid` is the postmaster of `data`: a live process whose cwd is the data dir (the
/// postmaster chdirs there). Guards against signalling an unrelated process that reused the pid
/// of a stale `postmaster.pid`.
pub fn is_postmaster_of(pid: i32, data: &Path) -> bool {
    if !pid_alive(pid) {
        return false;
    }
    let cwd = match std::fs::read_link(format!("/proc/{pid}/cwd")) {
        Ok(c) => c,
        Err(_) => return false,
    };
    let want = std::fs::canonicalize(data).unwrap_or_else(|_| data.to_path_buf());
    cwd == want
}

/// Sends `sig` to `pid`, ignoring "no such process".
pub fn signal(pid: i32, sig: Signal) {
    if pid > 0 {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// Sends `sig` to the process group led by `pid` (postmasters are session leaders).
pub fn signal_group(pid: i32, sig: Signal) {
    if pid > 0 {
        let _ = kill(Pid::from_raw(-pid), sig);
    }
}

/// Waits until `pid` is gone (reaping `child` if it is ours), up to `timeout`. True if gone.
pub async fn wait_gone(pid: i32, mut child: Option<&mut Child>, timeout: Duration) -> bool {
    let start = Instant::now();
    loop {
        let gone = match child.as_deref_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => !pid_alive(pid),
        };
        if gone {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Stops the postmaster `pid` with `sig` (SIGQUIT immediate, SIGINT fast), waiting up to
/// `grace`; then SIGKILLs its whole process group. Always finishes by killing stragglers in the
/// group (e.g. programs a superuser started), which is safe because the group is the instance's.
pub async fn stop_postmaster(
    pid: i32,
    mut child: Option<&mut Child>,
    sig: Signal,
    grace: Duration,
) {
    signal(pid, sig);
    if !wait_gone(pid, child.as_deref_mut(), grace).await {
        tracing::warn!(
            pid,
            "postmaster did not exit in time; killing its process group"
        );
        signal_group(pid, Signal::SIGKILL);
        wait_gone(pid, child, Duration::from_secs(5)).await;
    }
    signal_group(pid, Signal::SIGKILL);
}

/// How to start one server.
pub struct ServerSpec<'a> {
    /// Binaries to use.
    pub bins: &'a PgBinaries,
    /// OS user.
    pub run_as: &'a RunAs,
    /// Start in an empty network namespace.
    pub netns: bool,
    /// Data directory.
    pub data: &'a Path,
    /// Directory for the unix socket.
    pub socket_dir: &'a Path,
    /// File that receives the server's stdout and stderr.
    pub log: &'a Path,
    /// `max_connections`.
    pub max_connections: u32,
    /// Extra `-c name=value` settings, applied after the defaults.
    pub extra: &'a [(&'a str, String)],
}

/// Starts `postgres` directly (no pg_ctl) and waits until `postmaster.pid` says `ready`.
/// On failure the child is killed and the error carries the tail of the log.
pub async fn start_postgres(spec: &ServerSpec<'_>) -> Result<Child, PgError> {
    let sock = spec.socket_dir.to_string_lossy();
    if sock.contains('"') {
        return Err(PgError::Other(
            "socket directory path contains a double quote".into(),
        ));
    }
    // 0600: the log can quote statements and data; instance dirs are only searchable (0711).
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(spec.log)?;
    let log2 = log.try_clone()?;
    let mut cmd = command(&spec.bins.postgres, spec.run_as, spec.netns);
    cmd.arg("-D").arg(spec.data);
    let mut settings: Vec<(&str, String)> = vec![
        ("listen_addresses", String::new()),
        // Quoted: the setting is a comma-separated list.
        ("unix_socket_directories", format!("\"{sock}\"")),
        ("port", PORT.to_string()),
        ("fsync", "off".into()),
        ("synchronous_commit", "off".into()),
        ("full_page_writes", "off".into()),
        ("autovacuum", "off".into()),
        ("shared_buffers", "16MB".into()),
        ("max_connections", spec.max_connections.to_string()),
        ("max_wal_senders", "0".into()),
        ("wal_level", "minimal".into()),
        ("logging_collector", "off".into()),
    ];
    settings.extend(spec.extra.iter().cloned());
    for (k, v) in &settings {
        cmd.arg("-c").arg(format!("{k}={v}"));
    }
    cmd.stdout(log).stderr(log2);
    let mut child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(|e| PgError::NotReady(format!("spawning postgres: {e}")))?;
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(PgError::NotReady(format!(
                "postgres exited ({status}): {}",
                log_tail(spec.log)
            )));
        }
        if let Some(pf) = read_pid_file(spec.data) {
            if pf.pid == pid && pf.status == "ready" {
                return Ok(child);
            }
        }
        if start.elapsed() > READY_TIMEOUT {
            stop_postmaster(
                pid,
                Some(&mut child),
                Signal::SIGQUIT,
                Duration::from_secs(2),
            )
            .await;
            return Err(PgError::NotReady(format!(
                "timed out after {}s: {}",
                READY_TIMEOUT.as_secs(),
                log_tail(spec.log)
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The last ~1500 bytes of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("(no log: {e})"),
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(1500)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).trim().to_string()
}

/// The socket file inside a socket directory.
pub fn socket_path(socket_dir: &Path) -> PathBuf {
    socket_dir.join(SOCKET_FILE)
}
