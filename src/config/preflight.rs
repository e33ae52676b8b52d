//! Checks beyond what types rule out that `serve` and `serve --check-config` share (admin key
//! length, distinct listeners), and what only `--check-config` looks at before anything
//! starts: the things on this machine the config points at (Postgres binaries, the data dir,
//! files, the admin key from the environment). Nothing is left behind: a data dir that does
//! not exist yet is created to prove it can be, then removed again.

use std::path::{Path, PathBuf};

use super::{Config, ConfigError};

/// Shortest admin key accepted, in bytes: 256 bits as hex is 64, as base64 43.
pub const MIN_ADMIN_KEY_BYTES: usize = 32;

/// An admin key given by the operator (`admin_key`, `SANDPIT_ADMIN_KEY`) must be long enough
/// to stand in for a password nobody can guess; `source` names where it came from.
pub fn check_admin_key(source: &'static str, key: &str) -> Result<(), ConfigError> {
    if key.len() >= MIN_ADMIN_KEY_BYTES {
        return Ok(());
    }
    let what = if key.is_empty() {
        "is empty".to_string()
    } else {
        format!("is {} bytes long", key.len())
    };
    Err(ConfigError::Invalid {
        key: source,
        message: format!(
            "{what}; an admin key must be at least {MIN_ADMIN_KEY_BYTES} bytes (e.g. `openssl rand -hex 32`), or leave it unset to have one generated into <data dir>/admin.key"
        ),
    })
}

fn invalid(key: &'static str, message: String) -> ConfigError {
    ConfigError::Invalid { key, message }
}

impl Config {
    /// The two listeners must not want the same port.
    pub(super) fn check_listeners(&self) -> Result<(), ConfigError> {
        // Port 0 asks the kernel for a free port: two of those never clash. A wildcard
        // address takes the port on every address, so it clashes with any other.
        let (l, a) = (self.listen, self.api_listen);
        let same_ip = l.ip() == a.ip() || l.ip().is_unspecified() || a.ip().is_unspecified();
        if l.port() == a.port() && l.port() != 0 && same_ip {
            return Err(ConfigError::Invalid {
                key: "api_listen",
                message: format!(
                    "{a} clashes with `listen` {l}: the Postgres and HTTP listeners need their own ports"
                ),
            });
        }
        Ok(())
    }

    /// Everything `--check-config` checks after [`Config::validate`]. `env_admin_key` is
    /// `SANDPIT_ADMIN_KEY` (empty counts as unset, as when serving).
    pub fn preflight(&self, env_admin_key: Option<&str>) -> Result<(), ConfigError> {
        if self.admin_key.is_none() {
            if let Some(k) = env_admin_key.filter(|k| !k.is_empty()) {
                check_admin_key("SANDPIT_ADMIN_KEY", k)?;
            }
        }
        if self.provider == "instance" {
            crate::pg::find_binaries(self.postgres.bin_dir.as_deref())
                .map_err(|e| invalid("postgres.bin_dir", e.to_string()))?;
        }
        check_data_dir(&self.data_dir).map_err(|m| invalid("data_dir", m))?;
        let tls_files = self.tls.mode == "files";
        let files: [(&'static str, Option<&PathBuf>); 7] = [
            ("golden.sql", self.golden.sql.as_ref()),
            ("tls.cert", self.tls.cert.as_ref().filter(|_| tls_files)),
            ("tls.key", self.tls.key.as_ref().filter(|_| tls_files)),
            ("template.golden_sql", self.template.golden_sql.as_ref()),
            ("template.ca_file", self.template.ca_file.as_ref()),
            ("remote.ca_file", self.remote.ca_file.as_ref()),
            ("registry.ca_file", self.registry.ca_file.as_ref()),
        ];
        for (key, path) in files {
            if let Some(p) = path {
                std::fs::File::open(p)
                    .map_err(|e| invalid(key, format!("{}: {e}", p.display())))?;
            }
        }
        Ok(())
    }
}

/// The data dir is a writable directory, or can be created. Proven by doing it: a probe file
/// in an existing dir, or creating the missing directories (then removing all of it).
fn check_data_dir(dir: &Path) -> Result<(), String> {
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Err(format!("{shown} exists and is not a directory")),
        Ok(_) => probe_write(dir).map_err(|e| format!("{shown} is not writable: {e}")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The directories to create, deepest first, up to the first that exists.
            let mut missing = Vec::new();
            let mut cur = dir.to_path_buf();
            while !cur.as_os_str().is_empty() && !cur.exists() {
                missing.push(cur.clone());
                cur = match cur.parent() {
                    Some(p) => p.to_path_buf(),
                    None => break,
                };
            }
            let made = create_chain(&missing);
            let result = match made {
                Ok(()) => probe_write(dir),
                Err(e) => Err(e),
            };
            // Whatever was made goes again, deepest first; `--check-config` starts nothing.
            for d in &missing {
                let _ = std::fs::remove_dir(d);
            }
            result.map_err(|e| format!("{shown} cannot be created: {e}"))
        }
        Err(e) => Err(format!("{shown}: {e}")),
    }
}

fn create_chain(missing_deepest_first: &[PathBuf]) -> std::io::Result<()> {
    for d in missing_deepest_first.iter().rev() {
        std::fs::create_dir(d)?;
    }
    Ok(())
}

fn probe_write(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".sandpit-check-config-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}
