//! TLS for clients: certificate from files, or a self-signed one generated on first start.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// A TLS setup problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls: cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("tls: {0}")]
    Invalid(String),
}

/// Build the acceptor the config asks for (None when TLS is off).
pub fn acceptor(
    cfg: &TlsConfig,
    data_dir: &Path,
    hosts: &[String],
) -> Result<Option<TlsAcceptor>, TlsError> {
    let (cert_path, key_path) = match cfg.mode.as_str() {
        "off" => return Ok(None),
        "files" => match (&cfg.cert, &cfg.key) {
            (Some(c), Some(k)) => (c.clone(), k.clone()),
            _ => {
                return Err(TlsError::Invalid(
                    "mode \"files\" needs cert and key".into(),
                ))
            }
        },
        _ => {
            let dir = data_dir.join("tls");
            let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
            if !c.exists() || !k.exists() {
                generate(&dir, hosts)?;
            }
            (c, k)
        }
    };
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.display().to_string(),
            source,
        })
    };
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &read(&cert_path)?[..])
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Invalid(format!("certificate {}: {e}", cert_path.display())))?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &read(&key_path)?[..])
        .map_err(|e| TlsError::Invalid(format!("key {}: {e}", key_path.display())))?
        .ok_or_else(|| TlsError::Invalid(format!("no private key in {}", key_path.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Invalid(e.to_string()))?;
    // No 0-RTT: early data would be readable before the handshake authenticates anything.
    debug_assert_eq!(config.max_early_data_size, 0);
    Ok(Some(TlsAcceptor::from(Arc::new(config))))
}

fn generate(dir: &Path, hosts: &[String]) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    names.extend(hosts.iter().cloned());
    names.dedup();
    let ck =
        rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::Invalid(e.to_string()))?;
    let w = |name: &str, data: &str, mode: u32| -> Result<(), TlsError> {
        let p = dir.join(name);
        let err = |source| TlsError::Read {
            path: p.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&p)
            .map_err(err)?;
        f.write_all(data.as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)
    };
    w("key.pem", &ck.key_pair.serialize_pem(), 0o600)?;
    w("cert.pem", &ck.cert.pem(), 0o644)?;
    tracing::info!(dir = %dir.display(), "generated a self-signed TLS certificate");
    Ok(())
}
