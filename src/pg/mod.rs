//! Local PostgreSQL server binaries, the unprivileged OS user servers run as, and process control.

pub mod process;
pub mod user;

use std::path::{Path, PathBuf};

/// Failures finding binaries, resolving the OS user, and starting servers. Providers turn
/// them into their own error (same messages, same kinds) with `From`.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("no PostgreSQL server binaries found ({0}); install the Debian package `postgresql` or set postgres.bin_dir")]
    NoBinaries(String),
    #[error("backend did not become ready: {0}")]
    NotReady(String),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
}

/// The PostgreSQL programs sandpit needs, from one installation.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    /// Directory the programs were found in.
    pub bin_dir: PathBuf,
    /// The server (`postgres`).
    pub postgres: PathBuf,
    /// `initdb`, to create the golden cluster.
    pub initdb: PathBuf,
    /// `psql`, to run the golden SQL file exactly as a person would.
    pub psql: PathBuf,
    /// Major version of the server (e.g. 15); part of the golden's identity.
    pub major: u32,
}

/// Finds the server binaries: `configured` (authoritative when given), else `pg_config --bindir`,
/// else the newest `/usr/lib/postgresql/<N>/bin`.
pub fn find_binaries(configured: Option<&Path>) -> Result<PgBinaries, PgError> {
    if let Some(dir) = configured {
        // An explicit setting must not silently fall back to some other installation.
        return complete(dir).ok_or_else(|| {
            PgError::NoBinaries(format!(
                "postgres.bin_dir {} lacks postgres, initdb or psql",
                dir.display()
            ))
        });
    }
    let mut tried = Vec::new();
    if let Some(dir) = pg_config_bindir() {
        if let Some(b) = complete(&dir) {
            return Ok(b);
        }
        tried.push(dir.display().to_string());
    }
    for dir in debian_bin_dirs() {
        if let Some(b) = complete(&dir) {
            return Ok(b);
        }
        tried.push(dir.display().to_string());
    }
    let detail = if tried.is_empty() {
        "no pg_config and no /usr/lib/postgresql/*/bin".to_string()
    } else {
        format!("tried {}", tried.join(", "))
    };
    Err(PgError::NoBinaries(detail))
}

/// `pg_config --bindir`, when pg_config is on PATH.
fn pg_config_bindir() -> Option<PathBuf> {
    let out = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// `/usr/lib/postgresql/*/bin`, newest major version first (numeric, so 16 sorts above 9).
fn debian_bin_dirs() -> Vec<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/usr/lib/postgresql") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let major = name.split('.').next().and_then(|m| m.parse::<u32>().ok());
            if let Some(m) = major {
                found.push((m, e.path().join("bin")));
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The set of binaries in `dir`, if all are there and the server reports its version.
fn complete(dir: &Path) -> Option<PgBinaries> {
    let postgres = dir.join("postgres");
    let initdb = dir.join("initdb");
    let mut psql = dir.join("psql");
    if !psql.is_file() {
        // Some packagings ship psql only on PATH (client and server packages split).
        psql = PathBuf::from("/usr/bin/psql");
    }
    if !(postgres.is_file() && initdb.is_file() && psql.is_file()) {
        return None;
    }
    let major = server_major(&postgres)?;
    Some(PgBinaries {
        bin_dir: dir.to_path_buf(),
        postgres,
        initdb,
        psql,
        major,
    })
}

/// Parses `postgres (PostgreSQL) 15.18 (Debian …)` into 15.
fn server_major(postgres: &Path) -> Option<u32> {
    let out = std::process::Command::new(postgres)
        .arg("--version")
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    parse_major(&s)
}

/// The major version from `postgres --version` output (`9.6.1` → 9, `15.4` → 15, `17beta1` → 17).
pub fn parse_major(version_line: &str) -> Option<u32> {
    let ver = version_line
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let digits: String = ver.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_major;

    #[test]
    fn majors() {
        assert_eq!(
            parse_major("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"),
            Some(15)
        );
        assert_eq!(parse_major("postgres (PostgreSQL) 17beta1"), Some(17));
        assert_eq!(parse_major("nothing"), None);
    }
}
