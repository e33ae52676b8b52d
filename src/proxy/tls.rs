//! TLS for clients: certificate from files, or a self-signed one generated on first start;
//! and the certificate's `tls-server-end-point` channel-binding data for SCRAM-SHA-256-PLUS.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};
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

/// The listener's TLS: the acceptor, and the channel-binding data of its certificate.
pub struct ServerTls {
    /// Accepts TLS connections after an SSLRequest.
    pub acceptor: TlsAcceptor,
    /// `tls-server-end-point` data (RFC 5929): the hash of the server certificate, with the
    /// hash its signature uses (SHA-256 for MD5/SHA-1). None when that hash is not defined
    /// (Ed25519, RSA-PSS): SCRAM-SHA-256-PLUS is then not offered.
    pub binding: Option<Vec<u8>>,
}

/// The ALPN protocol name PostgreSQL 17 registered for its wire protocol over TLS.
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// Build the TLS setup the config asks for (None when TLS is off). `alpn`: the one
/// application protocol offered ([`ALPN_POSTGRESQL`] on the Postgres listener; None where
/// HTTP clients connect, whose ALPN offer would find no match).
pub fn acceptor(
    cfg: &TlsConfig,
    data_dir: &Path,
    hosts: &[String],
    alpn: Option<&[u8]>,
) -> Result<Option<ServerTls>, TlsError> {
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
    let binding = certs.first().and_then(|c| server_end_point(c.as_ref()));
    match &binding {
        Some(_) => tracing::info!("SCRAM-SHA-256-PLUS (tls-server-end-point) offered over TLS"),
        None => tracing::warn!(
            "the TLS certificate's signature has no tls-server-end-point hash; SCRAM-SHA-256-PLUS is not offered"
        ),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Invalid(e.to_string()))?;
    // On the Postgres listener, a client that offers ALPN must offer `postgresql` (libpq 17+
    // always does); one that offers none is served as before (older clients).
    config.alpn_protocols = alpn.map(|a| vec![a.to_vec()]).unwrap_or_default();
    // No 0-RTT: early data would be readable before the handshake authenticates anything.
    debug_assert_eq!(config.max_early_data_size, 0);
    Ok(Some(ServerTls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        binding,
    }))
}

/// The hash a certificate's signature algorithm uses, for tls-server-end-point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndPointHash {
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

/// RFC 5929 tls-server-end-point data of a DER certificate: its hash under the signature's
/// hash function, SHA-256 when that is MD5 or SHA-1. None for signatures without one.
pub fn server_end_point(cert_der: &[u8]) -> Option<Vec<u8>> {
    Some(match signature_hash(cert_der)? {
        EndPointHash::Sha224 => Sha224::digest(cert_der).to_vec(),
        EndPointHash::Sha256 => Sha256::digest(cert_der).to_vec(),
        EndPointHash::Sha384 => Sha384::digest(cert_der).to_vec(),
        EndPointHash::Sha512 => Sha512::digest(cert_der).to_vec(),
    })
}

/// One DER element at the start of `b`: (tag, contents, rest). Lengths are checked against
/// the buffer before slicing.
fn der_element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, b) = b.split_first()?;
    let (len, b) = if first < 0x80 {
        (first as usize, b)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n]
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | x as usize);
        (len, &b[n..])
    };
    if b.len() < len {
        return None;
    }
    Some((tag, &b[..len], &b[len..]))
}

/// Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm AlgorithmIdentifier, … }.
fn signature_hash(cert_der: &[u8]) -> Option<EndPointHash> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (SEQUENCE, cert, _) = der_element(cert_der)? else {
        return None;
    };
    let (SEQUENCE, _tbs, rest) = der_element(cert)? else {
        return None;
    };
    let (SEQUENCE, alg, _) = der_element(rest)? else {
        return None;
    };
    let (OID, oid, _) = der_element(alg)? else {
        return None;
    };
    const RSA_PKCS1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03];
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
    use EndPointHash::*;
    if oid == ECDSA_SHA1 {
        return Some(Sha256);
    }
    if let Some(&[last]) = oid.strip_prefix(RSA_PKCS1) {
        return match last {
            4 | 5 | 11 => Some(Sha256), // md5, sha1, sha256 WithRSAEncryption
            12 => Some(Sha384),
            13 => Some(Sha512),
            14 => Some(Sha224),
            _ => None, // RSA-PSS (10) names its hash in parameters: not offered
        };
    }
    if let Some(&[last]) = oid.strip_prefix(ECDSA_SHA2) {
        return match last {
            1 => Some(Sha224),
            2 => Some(Sha256),
            3 => Some(Sha384),
            4 => Some(Sha512),
            _ => None,
        };
    }
    None
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
        crate::datadir::private_dirs(dir, Path::new("")).map_err(err)?;
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
    w("cert.pem", &ck.cert.pem(), 0o600)?;
    tracing::info!(dir = %dir.display(), "generated a self-signed TLS certificate");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(alg: &'static rcgen::SignatureAlgorithm) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn end_point_hash_follows_the_signature() {
        let der = cert_with(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(signature_hash(&der), Some(EndPointHash::Sha256));
        assert_eq!(
            server_end_point(&der).unwrap(),
            Sha256::digest(&der).to_vec()
        );
        let der = cert_with(&rcgen::PKCS_ECDSA_P384_SHA384);
        assert_eq!(signature_hash(&der), Some(EndPointHash::Sha384));
        assert_eq!(server_end_point(&der).unwrap().len(), 48);
        // Ed25519 has no separate hash: no channel binding defined.
        let der = cert_with(&rcgen::PKCS_ED25519);
        assert_eq!(server_end_point(&der), None);
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        for b in [
            &b""[..],
            b"\x30",
            b"\x30\x84\xff\xff\xff\xff",
            b"\x30\x03\x30\x01",
            b"\x30\x05\x30\x00\x30\x01\x06",
        ] {
            assert_eq!(server_end_point(b), None);
        }
    }
}
