//! Building a golden data directory: initdb, the gateway's configuration, a server to load
//! it (the SQL file, or a live database through [`super::live`]), a clean shutdown, its WAL
//! trimmed. Rebuilt only when its identity (SQL bytes, server major version,
//! [`GOLDEN_FORMAT`]) changes (see [`super::sql`]).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use sha2::{Digest, Sha256};

use super::live::{self, BuildReport};
use super::psql::{psql, tail, CHECKPOINTS};
use super::roles::{create_roles, AGENT, AGENT_READ, AGENT_WRITE, DATABASE, REVIEWER, SUPERUSER};
use super::socket_dir::{prepare_socket_dir, remove_socket_dir, socket_dir_for};
use super::{GoldenCtx, Load, GOLDEN_FORMAT, READY_MARKER};
use crate::pg::process::{self, ServerSpec};
use crate::pg::PgBinaries;
use crate::provider::dirs::sync_dir;
use crate::provider::ProviderError;

/// Directory name of the golden for these SQL bytes and server version.
pub fn golden_name(sql: &[u8], major: u32) -> String {
    let mut h = Sha256::new();
    h.update(sql);
    h.update(major.to_string().as_bytes());
    h.update(GOLDEN_FORMAT.as_bytes());
    format!("golden-{}", &hex::encode(h.finalize())[..16])
}

/// How long a server left by an interrupted build gets to exit after SIGQUIT.
const LEFTOVER_GRACE: Duration = Duration::from_secs(5);

/// Stops the server a build killed mid-way left running in `tmp` (data dir `tmp/data`) and
/// removes its socket dir, so removing `tmp` leaves nothing behind. Immediate shutdown: the
/// build is thrown away. Blocks up to a few seconds; called at start, before serving.
pub(crate) fn stop_leftover_server(tmp: &Path) {
    let data = tmp.join("data");
    if let Some(pf) = process::read_pid_file(&data) {
        // Only a live process working in this data dir: the pid may have been reused.
        if process::is_postmaster_of(pf.pid, &data) {
            tracing::warn!(pid = pf.pid, dir = %tmp.display(),
                "stopping the server of an interrupted golden build");
            process::signal(pf.pid, Signal::SIGQUIT);
            let deadline = std::time::Instant::now() + LEFTOVER_GRACE;
            while process::pid_alive(pf.pid) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            // Stragglers in its group (postmasters are session leaders).
            process::signal_group(pf.pid, Signal::SIGKILL);
        }
    }
    if let Err(e) = remove_socket_dir(&socket_dir_for(tmp), tmp) {
        tracing::warn!(dir = %tmp.display(), error = %e, "removing the socket dir of an interrupted build failed");
    }
}

/// Builds a stopped, cleanly shut down golden in `tmp` (its data dir is `tmp/data`).
pub async fn build(
    ctx: &GoldenCtx<'_>,
    tmp: &Path,
    what: Load<'_>,
) -> Result<Option<BuildReport>, ProviderError> {
    if tmp.exists() {
        fs::remove_dir_all(tmp)?;
    }
    fs::DirBuilder::new().mode(0o711).create(tmp)?;
    fs::set_permissions(tmp, fs::Permissions::from_mode(0o711))?;
    let data = tmp.join("data");
    fs::DirBuilder::new().mode(0o700).create(&data)?;
    ctx.run_as.chown(&data)?;

    initdb(ctx, &data).await?;
    write_config(ctx, &data)?;

    let sock = socket_dir_for(tmp);
    prepare_socket_dir(&sock, ctx.run_as)?;
    let log = tmp.join("build.log");
    // Small WAL floor during the build so the final checkpoint leaves few segments to copy.
    // No recycling: a recycled segment keeps the bytes of the records it held before, and
    // those may be values a masked build removed.
    let extra = [
        ("min_wal_size", "2MB".to_string()),
        ("wal_recycle", "off".to_string()),
    ];
    let spec = ServerSpec {
        bins: ctx.bins,
        run_as: ctx.run_as,
        netns: ctx.netns,
        data: &data,
        socket_dir: &sock,
        log: &log,
        max_connections: ctx.max_connections,
        extra: &extra,
    };
    let mut child = process::start_postgres(&spec).await?;
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let result = match what {
        Load::Sql(path) => load(ctx, &sock, path).await.map(|()| None),
        Load::Live(spec) => live::load(ctx, &sock, spec).await.map(Some),
    };
    if result.is_err() {
        process::stop_postmaster(
            pid,
            Some(&mut child),
            Signal::SIGQUIT,
            Duration::from_secs(5),
        )
        .await;
        let _ = remove_socket_dir(&sock, tmp);
        return result;
    }
    // Fast (clean) shutdown: the copy must not need crash recovery.
    process::signal(pid, Signal::SIGINT);
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    let _ = remove_socket_dir(&sock, tmp);
    let report = result?;
    match status {
        Ok(Ok(s)) if s.success() => {}
        other => {
            process::signal_group(pid, Signal::SIGKILL);
            return Err(ProviderError::Golden(format!(
                "golden server did not shut down cleanly ({other:?}): {}",
                process::log_tail(&log)
            )));
        }
    }
    trim_wal(ctx.bins, &data).await?;
    if report.is_some() {
        // Server messages of a masked build may quote original values (a failed constraint).
        let _ = fs::remove_file(&log);
    }
    // fsync was off while building: flush everything before declaring the golden done.
    sync_dir(tmp);
    fs::write(tmp.join(READY_MARKER), format!("{GOLDEN_FORMAT}\n"))?;
    Ok(report)
}

/// After a clean shutdown only the segment holding the shutdown checkpoint is needed; the
/// recycled ones would be copied into every fork for nothing.
async fn trim_wal(bins: &PgBinaries, data: &Path) -> Result<(), ProviderError> {
    let out = tokio::process::Command::new(bins.bin_dir.join("pg_controldata"))
        .env_clear()
        .env("LC_ALL", "C")
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .await;
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).to_string(),
        other => {
            tracing::debug!(?other, "pg_controldata unavailable; not trimming WAL");
            return Ok(());
        }
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let (Some(state), Some(redo)) = (
        field("Database cluster state:"),
        field("Latest checkpoint's REDO WAL file:"),
    ) else {
        return Ok(());
    };
    if state != "shut down" || redo.len() != 24 {
        tracing::warn!(%state, "golden not cleanly shut down; keeping its WAL");
        return Ok(());
    }
    for e in fs::read_dir(data.join("pg_wal"))?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let is_segment = name.len() == 24 && name.chars().all(|c| c.is_ascii_hexdigit());
        if is_segment && name != redo && e.file_type().map(|t| t.is_file()).unwrap_or(false) {
            fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

async fn initdb(ctx: &GoldenCtx<'_>, data: &Path) -> Result<(), ProviderError> {
    let mut cmd = process::command(&ctx.bins.initdb, ctx.run_as, false);
    cmd.arg("-D")
        .arg(data)
        .args([
            "-U",
            SUPERUSER,
            "--auth-local=peer",
            "--auth-host=reject",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        // no-sync: the build syncs once at the end; 1 MB WAL segments keep the copied pg_wal small.
        .args(["--no-sync", "--wal-segsize=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::process::Command::from(cmd)
        .output()
        .await
        .map_err(ProviderError::golden_io("running initdb"))?;
    if !out.status.success() {
        return Err(ProviderError::Golden(format!(
            "initdb failed: {}",
            tail(&String::from_utf8_lossy(&out.stderr))
        )));
    }
    Ok(())
}

/// Peer auth only over the socket, mapped from the gateway's OS user; no TCP at all.
fn write_config(ctx: &GoldenCtx<'_>, data: &Path) -> Result<(), ProviderError> {
    let hba = "# sandpit: unix socket only, peer identity mapped by pg_ident map \"sandpit\"\n\
               local all all peer map=sandpit\n";
    let u = ctx.gateway_user;
    if u.chars().any(|c| c.is_whitespace() || c == '"' || c == '#') {
        return Err(ProviderError::Golden(format!(
            "gateway OS user name {u:?} cannot go into pg_ident.conf"
        )));
    }
    let mut ident =
        "# sandpit: the gateway's OS user may log in as the agent roles, the reviewer and the admin role\n"
            .to_string();
    for role in [AGENT, AGENT_WRITE, AGENT_READ, REVIEWER, SUPERUSER] {
        ident.push_str(&format!("sandpit {u} {role}\n"));
    }
    let conf = "\n# sandpit\nlisten_addresses = ''\nwal_level = minimal\nmax_wal_senders = 0\n\
                max_wal_size = 64MB\nmin_wal_size = 32MB\nfsync = off\nsynchronous_commit = off\n\
                full_page_writes = off\nautovacuum = off\nlogging_collector = off\n";
    for (file, text, append) in [
        ("pg_hba.conf", hba, false),
        ("pg_ident.conf", ident.as_str(), false),
        ("postgresql.conf", conf, true),
    ] {
        let p = data.join(file);
        if append {
            let mut old = fs::read_to_string(&p)?;
            old.push_str(text);
            fs::write(&p, old)?;
        } else {
            fs::write(&p, text)?;
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600))?;
        ctx.run_as.chown(&p)?;
    }
    Ok(())
}

/// Roles, database, then the golden SQL as the agent (so the agent owns exactly its objects).
pub(crate) async fn load(
    ctx: &GoldenCtx<'_>,
    sock: &Path,
    sql_path: &Path,
) -> Result<(), ProviderError> {
    create_roles(ctx, sock).await?;
    let file = sql_path.to_string_lossy().to_string();
    psql(&ctx.bins.psql, sock, AGENT, DATABASE, &["-f", &file]).await?;
    // Hint bits and visibility map set once here, instead of dirtying pages in every fork.
    psql(
        &ctx.bins.psql,
        sock,
        SUPERUSER,
        DATABASE,
        &["-c", "VACUUM ANALYZE"],
    )
    .await?;
    psql(&ctx.bins.psql, sock, SUPERUSER, "postgres", &CHECKPOINTS).await?;
    Ok(())
}
