//! Running `psql` against a golden's build server (or a fork's), and trimming what it says.

use std::path::Path;
use std::process::Stdio;

use crate::pg::process;
use crate::provider::ProviderError;

/// Ends the build's WAL: a switch to a fresh segment, then checkpoints, so the one segment
/// kept by `build::trim_wal` holds no record of the load.
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
        .map_err(ProviderError::golden_io("running psql"))?;
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
