//! Token ids, secrets, and the verifiers the registry stores instead of secrets.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::rngs::OsRng;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A token's public id, e.g. `sp_abcdefghij234567abcd`.
pub type TokenId = String;

/// Prefix of every token id; makes ids recognisable in logs and DSNs.
const ID_PREFIX: &str = "sp_";
/// Number of base32 characters after the prefix (5 bits each, 100 bits).
const ID_CHARS: usize = 20;
/// RFC 4648 base32 alphabet, lowercased so the id is a valid unquoted Postgres user name.
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
/// Secret length in bytes (256 bits).
const SECRET_BYTES: usize = 32;
/// Longest secret `parse_full_token` accepts; real ones are 43 chars.
const MAX_SECRET_CHARS: usize = 128;
/// Salt length for the SCRAM verifier.
const SCRAM_SALT_BYTES: usize = 16;
/// PBKDF2 iterations for the SCRAM verifier (PostgreSQL's default).
pub(crate) const SCRAM_ITERATIONS: u32 = 4096;

type HmacSha256 = Hmac<Sha256>;

/// A token's public id: "sp_" + 20 lowercase base32 [a-z2-7] chars (100 bits) — valid as a Postgres user name, URL safe.
pub fn new_token_id() -> String {
    let mut raw = [0u8; ID_CHARS];
    OsRng.fill_bytes(&mut raw);
    let mut id = String::with_capacity(ID_PREFIX.len() + ID_CHARS);
    id.push_str(ID_PREFIX);
    // 256 is a multiple of 32, so masking keeps every symbol equally likely.
    id.extend(raw.iter().map(|b| BASE32[usize::from(b & 0x1f)] as char));
    id
}

/// Is this string shaped like a token id?
pub fn is_token_id(s: &str) -> bool {
    match s.strip_prefix(ID_PREFIX) {
        Some(rest) => rest.len() == ID_CHARS && rest.bytes().all(|b| BASE32.contains(&b)),
        None => false,
    }
}

/// 256-bit random secret from OsRng, base64url without padding (43 chars).
pub fn new_secret() -> String {
    let mut raw = [0u8; SECRET_BYTES];
    OsRng.fill_bytes(&mut raw);
    URL_SAFE_NO_PAD.encode(raw)
}

/// "the whole token" used for cleartext password auth: "<id>.<secret>". Returns (id, secret) or None.
///
/// The id must be a well-formed token id and the secret a non-empty run of
/// base64url characters (at most 128); whether the secret is right is the
/// verifier's business.
pub fn parse_full_token(s: &str) -> Option<(&str, &str)> {
    let (id, secret) = s.split_once('.')?;
    let secret_ok = !secret.is_empty()
        && secret.len() <= MAX_SECRET_CHARS
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (is_token_id(id) && secret_ok).then_some((id, secret))
}

/// What the registry stores instead of the secret. Serialize/Deserialize (serde), bytes as base64 strings in JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Verifier {
    /// Lowercase hex of SHA-256(secret), for the cleartext path.
    pub sha256: String,
    /// SCRAM-SHA-256 verifier, for the SCRAM path.
    pub scram: ScramVerifier,
}

/// SCRAM-SHA-256 verifier (RFC 5802 section 3); all byte fields are standard base64.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScramVerifier {
    /// Random salt given to the client.
    pub salt: String,
    /// PBKDF2 iteration count given to the client.
    pub iterations: u32,
    /// SHA-256(ClientKey).
    pub stored_key: String,
    /// HMAC(SaltedPassword, "Server Key").
    pub server_key: String,
}

impl Verifier {
    /// Derive from a secret: SHA-256 for the cleartext path; SCRAM-SHA-256 (random 16-byte salt, 4096 iterations, SASLprep-free since secrets are ASCII) for SCRAM.
    pub fn from_secret(secret: &str) -> Verifier {
        let mut salt = [0u8; SCRAM_SALT_BYTES];
        OsRng.fill_bytes(&mut salt);
        Verifier {
            sha256: hex::encode(Sha256::digest(secret.as_bytes())),
            scram: ScramVerifier::derive(secret.as_bytes(), &salt, SCRAM_ITERATIONS),
        }
    }

    /// Constant-time check of a cleartext secret (compare SHA-256 digests with subtle::ConstantTimeEq).
    pub fn check_cleartext(&self, secret: &str) -> bool {
        let mut stored = [0u8; 32];
        // A corrupt stored digest never matches anything.
        if hex::decode_to_slice(&self.sha256, &mut stored).is_err() {
            return false;
        }
        let given = Sha256::digest(secret.as_bytes());
        bool::from(given.as_slice().ct_eq(&stored))
    }
}

impl ScramVerifier {
    /// Compute the verifier for `password` with the given salt and iteration count.
    pub(crate) fn derive(password: &[u8], salt: &[u8], iterations: u32) -> ScramVerifier {
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut salted);
        let client_key = hmac_sha256(&salted, b"Client Key");
        let stored_key = Sha256::digest(client_key);
        let server_key = hmac_sha256(&salted, b"Server Key");
        ScramVerifier {
            salt: STANDARD.encode(salt),
            iterations,
            stored_key: STANDARD.encode(stored_key),
            server_key: STANDARD.encode(server_key),
        }
    }
}

/// HMAC-SHA-256 of `data` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length (long ones are hashed), so this cannot fail.
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_id_shape() {
        for _ in 0..100 {
            let id = new_token_id();
            assert_eq!(id.len(), 23);
            assert!(id.starts_with("sp_"));
            assert!(is_token_id(&id), "{id}");
        }
        assert_ne!(new_token_id(), new_token_id());
    }

    #[test]
    fn is_token_id_rejects() {
        assert!(is_token_id("sp_abcdefghijklmnopqrst"));
        assert!(is_token_id("sp_234567abcdefghijklmn"));
        for bad in [
            "",
            "sp_",
            "sp_abcdefghijklmnopqrs",   // 19 chars
            "sp_abcdefghijklmnopqrstu", // 21 chars
            "sp_Abcdefghijklmnopqrst",  // uppercase
            "sp_abcdefghijklmnopqrs1",  // 1 is not base32
            "sp_abcdefghijklmnopqrs8",
            "xx_abcdefghijklmnopqrst",
            "sp-abcdefghijklmnopqrst",
            "sp_abcdefghijklmnopqrs\u{e9}",
        ] {
            assert!(!is_token_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn secret_shape() {
        let s = new_secret();
        assert_eq!(s.len(), 43);
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(URL_SAFE_NO_PAD.decode(&s).unwrap().len(), 32);
        assert_ne!(new_secret(), new_secret());
    }

    #[test]
    fn full_token_parse() {
        let id = new_token_id();
        let secret = new_secret();
        let full = format!("{id}.{secret}");
        assert_eq!(
            parse_full_token(&full),
            Some((id.as_str(), secret.as_str()))
        );

        assert_eq!(parse_full_token(""), None);
        assert_eq!(parse_full_token(&id), None);
        assert_eq!(parse_full_token(&format!("{id}.")), None);
        assert_eq!(parse_full_token(&format!(".{secret}")), None);
        assert_eq!(parse_full_token(&format!("{id}.{secret}.x")), None);
        assert_eq!(parse_full_token(&format!("{id}.a b")), None);
        assert_eq!(parse_full_token(&format!("{id}.{}", "a".repeat(129))), None);
        assert_eq!(parse_full_token(&format!("sp_nope.{secret}")), None);
        assert_eq!(parse_full_token(&secret), None);
    }

    #[test]
    fn cleartext_check() {
        let secret = new_secret();
        let v = Verifier::from_secret(&secret);
        assert!(v.check_cleartext(&secret));
        assert!(!v.check_cleartext(&new_secret()));
        assert!(!v.check_cleartext(""));
        assert!(!v.check_cleartext(&secret[..42]));

        let mut corrupt = v.clone();
        corrupt.sha256 = "zz".into();
        assert!(!corrupt.check_cleartext(&secret));
    }

    #[test]
    fn verifier_fields() {
        let v = Verifier::from_secret("s3cret");
        assert_eq!(v.sha256.len(), 64);
        assert_eq!(v.scram.iterations, 4096);
        assert_eq!(STANDARD.decode(&v.scram.salt).unwrap().len(), 16);
        assert_eq!(STANDARD.decode(&v.scram.stored_key).unwrap().len(), 32);
        assert_eq!(STANDARD.decode(&v.scram.server_key).unwrap().len(), 32);
        // Fresh salt every time, so equal secrets give different SCRAM verifiers.
        let w = Verifier::from_secret("s3cret");
        assert_eq!(v.sha256, w.sha256);
        assert_ne!(v.scram.salt, w.scram.salt);
    }

    #[test]
    fn verifier_json_round_trip() {
        let secret = new_secret();
        let v = Verifier::from_secret(&secret);
        let json = serde_json::to_string(&v).unwrap();
        let back: Verifier = serde_json::from_str(&json).unwrap();
        assert_eq!(back.sha256, v.sha256);
        assert_eq!(back.scram.salt, v.scram.salt);
        assert_eq!(back.scram.iterations, v.scram.iterations);
        assert_eq!(back.scram.stored_key, v.scram.stored_key);
        assert_eq!(back.scram.server_key, v.scram.server_key);
        assert!(back.check_cleartext(&secret));
        assert!(json.contains("\"stored_key\""), "{json}");
    }
}
