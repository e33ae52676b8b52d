//! TLS towards backends reached over TCP: rustls client configurations for libpq-style
//! `sslmode` values.
//!
//! - `disable`: no TLS.
//! - `require`: encrypt; the certificate is **not** verified unless a CA file is configured
//!   (then it is verified like `verify-full`). This is libpq's `require` without a root
//!   certificate: it protects against passive eavesdropping, not against an active attacker.
//! - `verify-full`: encrypt and verify the chain and the host name, against the CA file when
//!   one is configured, else against the Mozilla roots (`webpki-roots`).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::BackendTls;

/// A TLS client configuration that could not be built (bad CA file, rustls refusal).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsConfigError(String);

/// How a backend connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS; certificate unverified unless a CA file is given.
    Require,
    /// TLS; chain and host name verified.
    VerifyFull,
}

impl SslMode {
    /// Parses `disable`, `require` or `verify-full`.
    pub fn parse(s: &str) -> Option<SslMode> {
        match s {
            "disable" => Some(SslMode::Disable),
            "require" => Some(SslMode::Require),
            "verify-full" => Some(SslMode::VerifyFull),
            _ => None,
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client configuration for `mode` (None for `disable`).
pub fn client_config(
    mode: SslMode,
    ca_file: Option<&Path>,
) -> Result<Option<Arc<ClientConfig>>, TlsConfigError> {
    let bad = |e: rustls::Error| TlsConfigError(format!("backend TLS: {e}"));
    let builder = || {
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(bad)
    };
    let cfg = match (mode, ca_file) {
        (SslMode::Disable, _) => return Ok(None),
        (SslMode::Require, None) => builder()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider())))
            .with_no_client_auth(),
        (_, ca) => {
            let mut roots = RootCertStore::empty();
            match ca {
                Some(path) => {
                    let pem = std::fs::read(path).map_err(|e| {
                        TlsConfigError(format!("reading CA file {}: {e}", path.display()))
                    })?;
                    let mut n = 0;
                    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                        let cert = cert.map_err(|e| {
                            TlsConfigError(format!("CA file {}: {e}", path.display()))
                        })?;
                        roots.add(cert).map_err(bad)?;
                        n += 1;
                    }
                    if n == 0 {
                        return Err(TlsConfigError(format!(
                            "CA file {} holds no certificate",
                            path.display()
                        )));
                    }
                }
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            builder()?
                .with_root_certificates(roots)
                .with_no_client_auth()
        }
    };
    Ok(Some(Arc::new(cfg)))
}

/// The `BackendTls` for a host under `config` (None when TLS is off).
pub fn for_host(config: &Option<Arc<ClientConfig>>, host: &str) -> Option<BackendTls> {
    config.as_ref().map(|c| BackendTls {
        config: c.clone(),
        server_name: host.to_string(),
    })
}

/// The server name to present and check for `host` (a DNS name or an IP address).
pub fn server_name(host: &str) -> std::io::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("bad TLS server name {host:?}: {e}"),
        )
    })
}

/// `sslmode=require` without a CA: accept any certificate, but still check that the server
/// holds its key (the handshake signatures), so the session key is really shared with it.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_build() {
        assert_eq!(SslMode::parse("require"), Some(SslMode::Require));
        assert_eq!(SslMode::parse("prefer"), None);
        assert!(client_config(SslMode::Disable, None).unwrap().is_none());
        assert!(client_config(SslMode::Require, None).unwrap().is_some());
        assert!(client_config(SslMode::VerifyFull, None).unwrap().is_some());
        let e = client_config(SslMode::VerifyFull, Some(Path::new("/nonexistent/ca.pem")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ca.pem"), "{e}");
    }
}
