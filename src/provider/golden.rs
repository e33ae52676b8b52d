//! The golden snapshot: a stopped, cleanly shut down data directory built from the golden SQL
//! file, which every fork copies. Rebuilt only when its identity (SQL bytes, server major
//! version, [`GOLDEN_FORMAT`]) changes (see [`super::golden_sql`]).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use sha2::{Digest, Sha256};

use crate::pg::process::{self, ServerSpec};
use crate::pg::user::RunAs;
use crate::pg::PgBinaries;
use crate::provider::ProviderError;

/// Bump when the way the golden is built changes, so old goldens are rebuilt.
/// v2: the database belongs to the admin role, and the golden has a login role per seatbelt
/// level and one for the review.
pub const GOLDEN_FORMAT: &str = "sandpit-golden-v2";
/// Superuser role, used only by the gateway (never handed to an agent). Owns the database,
/// so that no agent can change its connection limit, template flag or settings.
pub const SUPERUSER: &str = "sandpit_admin";
/// Role the gateway logs in as on behalf of an agent whose token may change the schema:
/// it owns schema `public` and every object of the golden.
pub const AGENT: &str = "agent";
/// Login role of tokens that may write rows but not change the schema: reads and writes
/// every table through `pg_read_all_data`/`pg_write_all_data`, owns nothing, creates nothing.
pub const AGENT_WRITE: &str = "agent_write";
/// Login role of read-only tokens: reads every table through `pg_read_all_data`, owns
/// nothing, creates nothing (not even temporary tables).
pub const AGENT_READ: &str = "agent_read";
/// Login role of the review: reads everything (`pg_read_all_data`, past row security), may
/// see and end the agents' sessions, owns nothing, writes nothing; its settings are out of
/// every agent's reach.
pub const REVIEWER: &str = "sandpit_review";
/// The only database the agent can reach.
pub const DATABASE: &str = "sandpit";
/// Written last into a finished golden; a golden without it is never used.
pub const READY_MARKER: &str = "sandpit-golden-ready";

/// Everything a golden build needs.
pub struct GoldenCtx<'a> {
    /// Server binaries.
    pub bins: &'a PgBinaries,
    /// OS user Postgres runs as.
    pub run_as: &'a RunAs,
    /// Start servers in an empty network namespace.
    pub netns: bool,
    /// Real (canonical) provider root.
    pub root: &'a Path,
    /// SQL file the golden is built from.
    pub sql_path: &'a Path,
    /// OS user of the gateway (peer identity mapped to the agent and superuser roles).
    pub gateway_user: &'a str,
    /// `max_connections` for the build server.
    pub max_connections: u32,
}

/// Directory name of the golden for these SQL bytes and server version.
pub fn golden_name(sql: &[u8], major: u32) -> String {
    let mut h = Sha256::new();
    h.update(sql);
    h.update(major.to_string().as_bytes());
    h.update(GOLDEN_FORMAT.as_bytes());
    format!("golden-{}", &hex::encode(h.finalize())[..16])
}

/// What fills a new golden's `sandpit` database.
pub enum Load<'a> {
    /// Run a SQL file as the agent.
    Sql(&'a Path),
    /// Copy (and mask) a live database.
    Live(&'a crate::provider::golden_build::LiveSpec),
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
) -> Result<Option<crate::provider::golden_build::BuildReport>, ProviderError> {
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
        Load::Live(spec) => crate::provider::golden_build::load(ctx, &sock, spec)
            .await
            .map(Some),
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
        .map_err(|e| ProviderError::Golden(format!("running initdb: {e}")))?;
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

/// Attributes every non-admin role gets (stated, not left to defaults).
const PLAIN: &str = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION";

/// The roles and the database. The admin role owns the database (an owner could set its
/// connection limit, template flag and settings, and so lock the review out); the agent
/// owns schema `public` and, by loading the golden SQL, every object in it.
pub async fn create_roles(ctx: &GoldenCtx<'_>, sock: &Path) -> Result<(), ProviderError> {
    let statements = [
        format!("CREATE ROLE {AGENT} {PLAIN} NOBYPASSRLS"),
        format!(
            "CREATE ROLE {AGENT_WRITE} {PLAIN} NOBYPASSRLS IN ROLE pg_read_all_data, pg_write_all_data"
        ),
        format!("CREATE ROLE {AGENT_READ} {PLAIN} NOBYPASSRLS IN ROLE pg_read_all_data"),
        // BYPASSRLS: with row_security off, a policy (agent-written code) is never run and
        // cannot hide rows; pg_read_all_stats: the other roles' session states, to know
        // when their counters are published; pg_signal_backend: ending the agents'
        // sessions when a token ends (never the admin's: it is a superuser).
        format!(
            "CREATE ROLE {REVIEWER} {PLAIN} BYPASSRLS \
             IN ROLE pg_read_all_data, pg_read_all_stats, pg_signal_backend"
        ),
        format!("CREATE DATABASE {DATABASE} OWNER {SUPERUSER}"),
        "REVOKE ALL ON DATABASE postgres FROM PUBLIC".to_string(),
        "REVOKE ALL ON DATABASE template1 FROM PUBLIC".to_string(),
        format!("REVOKE ALL ON DATABASE {DATABASE} FROM PUBLIC"),
        // CREATE: schemas and trusted extensions, as its owner could before.
        format!("GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {DATABASE} TO {AGENT}"),
        format!("GRANT CONNECT ON DATABASE {DATABASE} TO {AGENT_WRITE}, {AGENT_READ}, {REVIEWER}"),
    ];
    let mut args: Vec<&str> = Vec::new();
    for s in &statements {
        args.extend(["-c", s.as_str()]);
    }
    psql(&ctx.bins.psql, sock, SUPERUSER, "postgres", &args).await?;
    psql(
        &ctx.bins.psql,
        sock,
        SUPERUSER,
        DATABASE,
        &["-c", &format!("ALTER SCHEMA public OWNER TO {AGENT}")],
    )
    .await
}

/// Which role a session of a token logs in as, from its seatbelt policy (None: no policy).
/// Postgres then refuses what the role may not do, whatever the statement text looks like:
/// DDL needs the owner; writes need `write`; everything else gets the read-only role.
/// `privilege` without `ddl` gains nothing: only an owner can grant on its objects.
pub fn login_role(allow: Option<&[String]>) -> &'static str {
    let Some(allow) = allow else { return AGENT };
    let has = |k: &str| allow.iter().any(|a| a == k);
    if has("ddl") {
        AGENT
    } else if has("write") {
        AGENT_WRITE
    } else {
        AGENT_READ
    }
}

/// Whether a data dir (a golden's copy) was built before the seatbelt and review roles
/// ([`GOLDEN_FORMAT`] v1): such forks are reached as the agent only, as they were then.
/// Only a readable map without the review role says so; anything else fails closed (the
/// narrower role's login is tried, and refused if it does not exist).
pub fn predates_policy_roles(data: &Path) -> bool {
    match fs::read_to_string(data.join("pg_ident.conf")) {
        Ok(t) => !t.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 3 && f[0] == "sandpit" && f[2] == REVIEWER
        }),
        Err(_) => false,
    }
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

/// Ends the build's WAL: a switch to a fresh segment, then checkpoints, so the one segment
/// kept by [`trim_wal`] holds no record of the load.
pub const CHECKPOINTS: [&str; 6] = [
    "-c",
    "SELECT pg_switch_wal()",
    "-c",
    "CHECKPOINT",
    "-c",
    "CHECKPOINT",
];

/// A `psql` command as the gateway's OS user against the socket in `sock`: no psqlrc, quiet,
/// stopping at the first error, with a clean environment (no PG* variables leak in).
pub fn psql_command(bin: &Path, sock: &Path, user: &str, db: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-p"])
        .arg(process::PORT.to_string())
        .arg("-h")
        .arg(sock)
        .args(["-U", user, "-d", db]);
    cmd
}

/// Runs `psql` as the gateway's OS user against the socket in `sock`.
pub async fn psql(
    bin: &Path,
    sock: &Path,
    user: &str,
    db: &str,
    args: &[&str],
) -> Result<(), ProviderError> {
    let out = psql_command(bin, sock, user, db)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .map_err(|e| ProviderError::Golden(format!("running psql: {e}")))?;
    if !out.status.success() {
        return Err(ProviderError::Golden(format!(
            "psql as {user} on {db} failed: {}",
            tail(&String::from_utf8_lossy(&out.stderr))
        )));
    }
    Ok(())
}

/// The last 2000 bytes of a message.
pub fn tail(s: &str) -> String {
    let s = s.trim();
    let start = s.len().saturating_sub(2000);
    let start = (start..=s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

/// Socket directory for a server whose files live in `dir`: `<dir>/s` if the socket path fits
/// comfortably in `sun_path`, else a short per-dir path under /tmp.
pub fn socket_dir_for(dir: &Path) -> PathBuf {
    let local = dir.join("s");
    if process::socket_path(&local).as_os_str().len() < 100 {
        return local;
    }
    let h = hex::encode(Sha256::digest(dir.as_os_str().as_encoded_bytes()));
    PathBuf::from(format!("/tmp/sandpit-s-{}", &h[..16]))
}

/// Creates the socket directory (mode 0700, owned by the Postgres user: only it and root can
/// connect). Refuses a symlink or non-directory planted at that path.
pub fn prepare_socket_dir(dir: &Path, run_as: &RunAs) -> Result<(), ProviderError> {
    match fs::symlink_metadata(dir) {
        // Under /tmp someone else could have created it first: only accept our own.
        Ok(m)
            if m.file_type().is_dir()
                && (m.uid() == run_as.uid || m.uid() == nix::unistd::geteuid().as_raw()) => {}
        Ok(_) => {
            return Err(ProviderError::Other(format!(
                "socket dir {} exists and is not our directory",
                dir.display()
            )))
        }
        Err(_) => fs::DirBuilder::new().mode(0o700).create(dir)?,
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    run_as.chown(dir)?;
    Ok(())
}

/// Removes a socket dir if it lives outside `owner_dir` (inside, it goes with the owner dir).
pub fn remove_socket_dir(sock: &Path, owner_dir: &Path) -> Result<(), ProviderError> {
    if sock.starts_with(owner_dir) {
        if sock.exists() {
            fs::remove_dir_all(sock)?;
        }
        return Ok(());
    }
    match fs::remove_dir_all(sock) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Flushes the filesystem holding `dir` (syncfs), best effort.
pub fn sync_dir(dir: &Path) {
    if let Ok(f) = fs::File::open(dir) {
        use std::os::unix::io::AsRawFd;
        if let Err(e) = nix::unistd::syncfs(f.as_raw_fd()) {
            tracing::warn!(dir = %dir.display(), error = %e, "syncfs failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_role_follows_the_widest_kind_the_policy_allows() {
        let role = |kinds: Option<&[&str]>| {
            let owned: Option<Vec<String>> =
                kinds.map(|k| k.iter().map(|s| s.to_string()).collect());
            login_role(owned.as_deref())
        };
        assert_eq!(role(None), AGENT);
        assert_eq!(role(Some(&["read", "write", "ddl"])), AGENT);
        assert_eq!(role(Some(&["ddl"])), AGENT);
        assert_eq!(role(Some(&["read", "write", "transaction"])), AGENT_WRITE);
        assert_eq!(role(Some(&["write"])), AGENT_WRITE);
        assert_eq!(role(Some(&["read", "transaction", "utility"])), AGENT_READ);
        assert_eq!(role(Some(&["read", "privilege"])), AGENT_READ);
        assert_eq!(role(Some(&[])), AGENT_READ);
    }

    #[test]
    fn only_a_readable_map_without_the_review_role_is_a_legacy_fork() {
        let dir = std::env::temp_dir().join(format!("sandpit-ident-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert!(!predates_policy_roles(&dir), "unreadable: fail closed");
        fs::write(
            dir.join("pg_ident.conf"),
            "sandpit root agent\nsandpit root sandpit_admin\n",
        )
        .unwrap();
        assert!(predates_policy_roles(&dir));
        fs::write(
            dir.join("pg_ident.conf"),
            "# x\nsandpit root agent\nsandpit root sandpit_review\n",
        )
        .unwrap();
        assert!(!predates_policy_roles(&dir));
        fs::remove_dir_all(&dir).unwrap();
    }
}
