//! A promotion target given as a libpq-style DSN, turned into the gateway's own backend
//! address (unix socket, TCP, or TLS with the DSN's sslmode and sslrootcert), so the target
//! is reached with the same code and TLS checks as every backend.

use std::path::{Path, PathBuf};

use crate::pgconn::{tls, BackendAddr, BackendTarget, Endpoint};
use crate::provider::conninfo;

/// A DSN that cannot be used, without quoting it (it may hold a password).
#[derive(Debug, thiserror::Error)]
#[error("target DSN: {0}")]
pub struct TargetError(pub String);

/// The target of `dsn`, and how to show it without its password.
pub fn parse(dsn: &str) -> Result<(BackendTarget, String), TargetError> {
    let p = conninfo::parse(dsn).map_err(|e| TargetError(e.to_string()))?;
    let get = |k: &str| conninfo::get(&p, k).filter(|v| !v.is_empty());
    let host = get("host")
        .or(get("hostaddr"))
        .ok_or_else(|| TargetError("names no host".into()))?
        .to_string();
    let port: u16 = match get("port") {
        None => 5432,
        Some(v) => v
            .parse()
            .map_err(|_| TargetError("port is not a number".into()))?,
    };
    let user = get("user")
        .ok_or_else(|| TargetError("names no user".into()))?
        .to_string();
    let database = get("dbname").unwrap_or(&user).to_string();
    let endpoint = if host.starts_with('/') {
        Endpoint::unix(PathBuf::from(&host).join(format!(".s.PGSQL.{port}")))
    } else {
        let mode = tls::SslMode::parse(get("sslmode").unwrap_or("disable"))
            .ok_or_else(|| TargetError("sslmode must be disable, require or verify-full".into()))?;
        let cfg = tls::client_config(mode, get("sslrootcert").map(Path::new))
            .map_err(|e| TargetError(e.to_string()))?;
        Endpoint {
            addr: BackendAddr::Tcp {
                host: host.clone(),
                port,
            },
            tls: tls::for_host(&cfg, &host),
        }
    };
    let shown = format!("postgresql://{user}@{host}:{port}/{database}");
    Ok((
        BackendTarget {
            endpoint,
            user,
            database,
            password: get("password").map(str::to_string),
            gate: None,
        },
        shown,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_and_tcp_targets_and_no_password_shown() {
        let (t, shown) = parse("host=/tmp/s port=5433 user=app dbname=shop password=pw").unwrap();
        assert_eq!(t.socket_path(), Some(Path::new("/tmp/s/.s.PGSQL.5433")));
        assert_eq!(t.password.as_deref(), Some("pw"));
        assert!(!shown.contains("pw"));
        let (t, _) = parse("postgresql://app:pw@db.example:6000/shop?sslmode=require").unwrap();
        assert!(t.endpoint.tls.is_some());
        assert!(parse("user=x").is_err());
    }
}
