//! SCRAM-SHA-256 server (RFC 5802 / RFC 7677), as PostgreSQL speaks it, with
//! SCRAM-SHA-256-PLUS channel binding of type `tls-server-end-point` (RFC 5929) over TLS.
//!
//! Every byte parsed here comes from an unauthenticated client, so parsing is
//! length-bounded, works on `&str` slices only, and reports errors instead of
//! panicking.

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::token::{hmac_sha256, ScramVerifier};

/// Longest client message accepted; real PostgreSQL ones are under 200 bytes.
const MAX_MESSAGE_LEN: usize = 2048;
/// Longest client nonce accepted; libpq and rust-postgres send 24 chars.
const MAX_NONCE_LEN: usize = 256;
/// Random bytes in our half of the nonce (as PostgreSQL does); 18 bytes encode to 24 chars without padding.
const SERVER_NONCE_BYTES: usize = 18;

/// Why a SCRAM exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ScramError {
    /// The client sent something that is not a valid SCRAM message.
    #[error("malformed SCRAM message: {0}")]
    Malformed(String),
    /// The client asked for channel binding (SCRAM-SHA-256-PLUS), which we do not offer.
    #[error("SCRAM channel binding is not supported")]
    ChannelBindingUnsupported,
    /// The client's channel-binding choice contradicts what was offered (a downgrade, or a
    /// mechanism that does not match the gs2 header).
    #[error("SCRAM channel binding negotiation error: {0}")]
    ChannelBindingNegotiation(&'static str),
    /// The channel-binding data is not our certificate's: someone is in the middle.
    #[error("SCRAM channel binding check failed")]
    ChannelBindingMismatch,
    /// The client's proof did not verify: wrong secret.
    #[error("password authentication failed")]
    BadProof,
    /// The client-final-message's nonce is not the one we agreed on.
    #[error("SCRAM nonce mismatch")]
    NonceMismatch,
}

fn malformed(what: &str) -> ScramError {
    // Static descriptions only: client bytes never reach error text or logs.
    ScramError::Malformed(what.to_owned())
}

/// Entry point of the server side of a SCRAM-SHA-256 exchange.
pub struct ScramServer;

/// Channel binding for one exchange: what the server offered and what the client chose.
#[derive(Debug, Clone, Copy, Default)]
pub struct Binding<'a> {
    /// tls-server-end-point data (the certificate hash) when SCRAM-SHA-256-PLUS was offered.
    pub offered: Option<&'a [u8]>,
    /// The client picked SCRAM-SHA-256-PLUS.
    pub plus: bool,
}

/// The only channel-binding type offered: the one every TLS stack can compute.
const CB_TYPE: &str = "tls-server-end-point";

/// Server state between server-first-message and client-final-message.
pub struct ScramServerFirst {
    /// What c= must decode to: the gs2 header as the client sent it, plus our certificate
    /// hash when channel binding is in use.
    expected_cbind: Vec<u8>,
    /// Channel binding is in use (SCRAM-SHA-256-PLUS).
    bound: bool,
    /// client nonce + server nonce.
    nonce: String,
    /// client-first-message-bare + "," + server-first-message, the first part of AuthMessage.
    auth_prefix: String,
    stored_key: [u8; 32],
    server_key: [u8; 32],
    /// Set when the stored verifier was unusable: the exchange runs to the end and then fails,
    /// so a corrupt registry entry looks like a wrong secret rather than a protocol error.
    doomed: bool,
}

impl fmt::Debug for ScramServerFirst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys stay out of debug output.
        f.debug_struct("ScramServerFirst")
            .field("nonce", &self.nonce)
            .finish_non_exhaustive()
    }
}

/// The parts of a stored verifier that the exchange needs, decoded.
struct Keys {
    salt_b64: String,
    iterations: u32,
    stored_key: [u8; 32],
    server_key: [u8; 32],
    usable: bool,
}

fn decode_key(b64: &str) -> Option<[u8; 32]> {
    if b64.len() > 64 {
        return None;
    }
    STANDARD.decode(b64).ok()?.try_into().ok()
}

impl Keys {
    fn from_verifier(v: &ScramVerifier) -> Keys {
        let salt_ok =
            !v.salt.is_empty() && v.salt.len() <= 1024 && STANDARD.decode(&v.salt).is_ok();
        if let (true, true, Some(stored_key), Some(server_key)) = (
            salt_ok,
            v.iterations > 0,
            decode_key(&v.stored_key),
            decode_key(&v.server_key),
        ) {
            return Keys {
                salt_b64: v.salt.clone(),
                iterations: v.iterations,
                stored_key,
                server_key,
                usable: true,
            };
        }
        // Corrupt verifier: play along with a random salt so the client sees a normal exchange.
        let mut salt = [0u8; 16];
        OsRng.fill_bytes(&mut salt);
        let mut stored_key = [0u8; 32];
        OsRng.fill_bytes(&mut stored_key);
        let mut server_key = [0u8; 32];
        OsRng.fill_bytes(&mut server_key);
        Keys {
            salt_b64: STANDARD.encode(salt),
            iterations: super::token::SCRAM_ITERATIONS,
            stored_key,
            server_key,
            usable: false,
        }
    }
}

/// printable = %x21-2B / %x2D-7E (RFC 5802): visible ASCII except ','.
fn is_printable_nonce(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// An attribute of the form `<letter>=<value>`; returns (letter, value).
fn attr(part: &str) -> Option<(u8, &str)> {
    let mut bytes = part.bytes();
    let name = bytes.next()?;
    if !name.is_ascii_alphabetic() || bytes.next()? != b'=' {
        return None;
    }
    // Both leading bytes are ASCII, so index 2 is a char boundary.
    Some((name, part.get(2..)?))
}

fn message_str(msg: &[u8]) -> Result<&str, ScramError> {
    if msg.is_empty() {
        return Err(malformed("empty message"));
    }
    if msg.len() > MAX_MESSAGE_LEN {
        return Err(malformed("message too long"));
    }
    std::str::from_utf8(msg).map_err(|_| malformed("message is not UTF-8"))
}

impl ScramServer {
    /// Handle the client-first-message (the bytes inside SASLInitialResponse after the mechanism)
    /// when no channel binding was offered: gs2 header "n,," or "y,,"; "p=" is
    /// ChannelBindingUnsupported. The n= user name is ignored (Postgres sends it empty).
    /// Returns the state and the server-first-message bytes (r=<client nonce + 18 random bytes b64>,s=<salt>,i=<iterations>).
    pub fn start(
        verifier: &ScramVerifier,
        client_first: &[u8],
    ) -> Result<(ScramServerFirst, Vec<u8>), ScramError> {
        Self::start_bound(verifier, client_first, Binding::default())
    }

    /// `start` with channel binding: when `binding.offered`, SCRAM-SHA-256-PLUS was offered
    /// and a "y" flag is a downgrade; when `binding.plus`, the header must be
    /// "p=tls-server-end-point" and c= must carry the offered data.
    pub fn start_bound(
        verifier: &ScramVerifier,
        client_first: &[u8],
        binding: Binding<'_>,
    ) -> Result<(ScramServerFirst, Vec<u8>), ScramError> {
        let mut raw = [0u8; SERVER_NONCE_BYTES];
        OsRng.fill_bytes(&mut raw);
        start_with_nonce(verifier, client_first, &STANDARD.encode(raw), binding)
    }
}

/// `start` with a chosen server nonce, so tests can replay RFC vectors.
fn start_with_nonce(
    verifier: &ScramVerifier,
    client_first: &[u8],
    server_nonce: &str,
    binding: Binding<'_>,
) -> Result<(ScramServerFirst, Vec<u8>), ScramError> {
    let msg = message_str(client_first)?;

    // gs2-header = gs2-cbind-flag "," [authzid] ","
    let (flag, rest) = msg
        .split_once(',')
        .ok_or_else(|| malformed("missing gs2 header"))?;
    let cb_data: Option<&[u8]> = match (flag, binding.plus, binding.offered) {
        (_, true, None) => {
            return Err(ScramError::ChannelBindingNegotiation(
                "SCRAM-SHA-256-PLUS was not offered",
            ))
        }
        ("n" | "y", true, _) => {
            return Err(ScramError::ChannelBindingNegotiation(
                "SCRAM-SHA-256-PLUS chosen, but the message has no channel binding",
            ))
        }
        ("n", false, _) => None,
        // "y": the client could bind but thinks we can't. Fine where we did not offer
        // -PLUS; where we did, someone stripped it from the list on the way (RFC 5802 §6).
        ("y", false, None) => None,
        ("y", false, Some(_)) => {
            return Err(ScramError::ChannelBindingNegotiation(
                "the client supports channel binding but thinks the server does not, and this server does",
            ))
        }
        (f, false, None) if f.starts_with("p=") => {
            return Err(ScramError::ChannelBindingUnsupported)
        }
        (f, false, Some(_)) if f.starts_with("p=") => {
            return Err(ScramError::ChannelBindingNegotiation(
                "SCRAM-SHA-256 chosen, but the message asks for channel binding",
            ))
        }
        (f, true, Some(data)) if f.starts_with("p=") => {
            if f != format!("p={CB_TYPE}") {
                return Err(ScramError::ChannelBindingNegotiation(
                    "unsupported channel binding type; only tls-server-end-point is offered",
                ));
            }
            Some(data)
        }
        _ => return Err(malformed("bad channel binding flag")),
    };
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or_else(|| malformed("missing gs2 header"))?;
    if !authzid.is_empty() {
        // PostgreSQL refuses authorization identities too.
        return Err(malformed("authorization identity is not supported"));
    }
    let mut expected_cbind = format!("{flag},,").into_bytes();
    if let Some(data) = cb_data {
        expected_cbind.extend_from_slice(data);
    }

    // client-first-message-bare = [reserved-mext ","] username "," nonce ["," extensions]
    let mut parts = bare.split(',');
    match parts.next().and_then(attr) {
        Some((b'n', _user)) => {} // ignored: the startup packet's user name is what counts
        Some((b'm', _)) => return Err(malformed("mandatory extensions are not supported")),
        _ => return Err(malformed("expected n= user name")),
    }
    let client_nonce = match parts.next().and_then(attr) {
        Some((b'r', nonce)) => nonce,
        _ => return Err(malformed("expected r= nonce")),
    };
    if client_nonce.len() > MAX_NONCE_LEN || !is_printable_nonce(client_nonce) {
        return Err(malformed("bad client nonce"));
    }
    for ext in parts {
        // Optional extensions are allowed and ignored, but must at least look like attributes.
        if attr(ext).is_none() {
            return Err(malformed("bad attribute"));
        }
    }

    let keys = Keys::from_verifier(verifier);
    let nonce = format!("{client_nonce}{server_nonce}");
    let server_first = format!("r={nonce},s={},i={}", keys.salt_b64, keys.iterations);
    let auth_prefix = format!("{bare},{server_first}");
    let state = ScramServerFirst {
        expected_cbind,
        bound: cb_data.is_some(),
        nonce,
        auth_prefix,
        stored_key: keys.stored_key,
        server_key: keys.server_key,
        doomed: !keys.usable,
    };
    Ok((state, server_first.into_bytes()))
}

impl ScramServerFirst {
    /// Handle client-final-message: check c= (base64 of the gs2 header), r= equals the combined nonce, verify the proof
    /// (ClientKey = proof XOR HMAC(StoredKey, AuthMessage); SHA-256(ClientKey) == StoredKey, compared in constant time).
    /// Returns the server-final-message bytes ("v=<b64 server signature>").
    pub fn finish(self, client_final: &[u8]) -> Result<Vec<u8>, ScramError> {
        let msg = message_str(client_final)?;

        // client-final-message = channel-binding "," nonce ["," extensions] "," proof
        // The proof is always last, and AuthMessage covers everything before it.
        let (without_proof, proof_b64) = msg
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("expected p= proof"))?;
        let mut parts = without_proof.split(',');

        let cbind_b64 = match parts.next().and_then(attr) {
            Some((b'c', v)) => v,
            _ => return Err(malformed("expected c= channel binding")),
        };
        let cbind = STANDARD
            .decode(cbind_b64)
            .map_err(|_| malformed("bad base64 in c="))?;
        if !bool::from(cbind.as_slice().ct_eq(&self.expected_cbind)) {
            if self.bound {
                return Err(ScramError::ChannelBindingMismatch);
            }
            if cbind.starts_with(b"p=") {
                return Err(ScramError::ChannelBindingUnsupported);
            }
            return Err(malformed("channel binding does not match gs2 header"));
        }

        let nonce = match parts.next().and_then(attr) {
            Some((b'r', v)) => v,
            _ => return Err(malformed("expected r= nonce")),
        };
        // Nonces are public, so an ordinary comparison leaks nothing.
        if nonce != self.nonce {
            return Err(ScramError::NonceMismatch);
        }
        for ext in parts {
            if attr(ext).is_none() {
                return Err(malformed("bad attribute"));
            }
        }

        let proof: [u8; 32] = STANDARD
            .decode(proof_b64)
            .map_err(|_| malformed("bad base64 in p="))?
            .try_into()
            .map_err(|_| malformed("proof has the wrong length"))?;

        let auth_message = format!("{},{}", self.auth_prefix, without_proof);
        let client_signature = hmac_sha256(&self.stored_key, auth_message.as_bytes());
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature.iter()) {
            *k ^= s;
        }
        let computed_stored = Sha256::digest(client_key);
        let ok = bool::from(computed_stored.as_slice().ct_eq(&self.stored_key));
        if !ok || self.doomed {
            return Err(ScramError::BadProof);
        }

        let server_signature = hmac_sha256(&self.server_key, auth_message.as_bytes());
        Ok(format!("v={}", STANDARD.encode(server_signature)).into_bytes())
    }
}

#[cfg(test)]
mod tests;
