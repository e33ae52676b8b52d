//! SCRAM-SHA-256 server (RFC 5802 / RFC 7677), as PostgreSQL speaks it.
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

/// Server state between server-first-message and client-final-message.
pub struct ScramServerFirst {
    /// gs2 header exactly as the client sent it ("n,," or "y,,"), to check c=.
    gs2_header: String,
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
    /// Handle the client-first-message (the bytes inside SASLInitialResponse after the mechanism).
    /// gs2 header must be "n,," or "y,," (we do not offer -PLUS; "p=" is ChannelBindingUnsupported). The n= user name is ignored (Postgres sends it empty).
    /// Returns the state and the server-first-message bytes (r=<client nonce + 18 random bytes b64>,s=<salt>,i=<iterations>).
    pub fn start(
        verifier: &ScramVerifier,
        client_first: &[u8],
    ) -> Result<(ScramServerFirst, Vec<u8>), ScramError> {
        let mut raw = [0u8; SERVER_NONCE_BYTES];
        OsRng.fill_bytes(&mut raw);
        start_with_nonce(verifier, client_first, &STANDARD.encode(raw))
    }
}

/// `start` with a chosen server nonce, so tests can replay RFC vectors.
fn start_with_nonce(
    verifier: &ScramVerifier,
    client_first: &[u8],
    server_nonce: &str,
) -> Result<(ScramServerFirst, Vec<u8>), ScramError> {
    let msg = message_str(client_first)?;

    // gs2-header = gs2-cbind-flag "," [authzid] ","
    let (flag, rest) = msg
        .split_once(',')
        .ok_or_else(|| malformed("missing gs2 header"))?;
    match flag {
        // "y": the client could bind but thinks we can't. That is true — we never
        // advertise -PLUS — so it is no downgrade. Must be refused if -PLUS is ever offered.
        "n" | "y" => {}
        f if f.starts_with("p=") => return Err(ScramError::ChannelBindingUnsupported),
        _ => return Err(malformed("bad channel binding flag")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or_else(|| malformed("missing gs2 header"))?;
    if !authzid.is_empty() {
        // PostgreSQL refuses authorization identities too.
        return Err(malformed("authorization identity is not supported"));
    }
    let gs2_header = format!("{flag},,");

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
        gs2_header,
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
        if cbind != self.gs2_header.as_bytes() {
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
mod tests {
    use super::*;
    use crate::auth::token::{new_secret, Verifier};
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Runs a full exchange with rust-postgres' SCRAM client; returns the server's verdict
    /// and whether the client accepted our server signature.
    fn exchange(verifier: &ScramVerifier, password: &str) -> Result<(), ScramError> {
        let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
        let (state, server_first) = ScramServer::start(verifier, client.message())?;
        client
            .update(&server_first)
            .expect("client accepts server-first");
        let server_final = state.finish(client.message())?;
        client
            .finish(&server_final)
            .expect("client accepts our server signature");
        Ok(())
    }

    fn client_first(cb: ChannelBinding) -> Vec<u8> {
        ScramSha256::new(b"x", cb).message().to_vec()
    }

    #[test]
    fn round_trip_with_postgres_client() {
        let secret = new_secret();
        let v = Verifier::from_secret(&secret);
        exchange(&v.scram, &secret).unwrap();
    }

    #[test]
    fn round_trip_survives_json() {
        let secret = new_secret();
        let v = Verifier::from_secret(&secret);
        let back: Verifier = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        exchange(&back.scram, &secret).unwrap();
    }

    #[test]
    fn round_trip_with_y_flag() {
        // "y,," = client supports channel binding but thinks we do not.
        let secret = new_secret();
        let v = Verifier::from_secret(&secret);
        let mut client = ScramSha256::new(secret.as_bytes(), ChannelBinding::unrequested());
        assert!(client.message().starts_with(b"y,,"));
        let (state, server_first) = ScramServer::start(&v.scram, client.message()).unwrap();
        client.update(&server_first).unwrap();
        let server_final = state.finish(client.message()).unwrap();
        client.finish(&server_final).unwrap();
    }

    #[test]
    fn wrong_secret_is_bad_proof() {
        let v = Verifier::from_secret(&new_secret());
        let mut client = ScramSha256::new(new_secret().as_bytes(), ChannelBinding::unsupported());
        let (state, server_first) = ScramServer::start(&v.scram, client.message()).unwrap();
        client.update(&server_first).unwrap();
        assert!(matches!(
            state.finish(client.message()),
            Err(ScramError::BadProof)
        ));
    }

    #[test]
    fn server_first_shape() {
        let v = Verifier::from_secret("pw");
        let cf = b"n,,n=,r=abcdefghijklmnopqrstuvwx";
        let (_, sf) = ScramServer::start(&v.scram, cf).unwrap();
        let sf = String::from_utf8(sf).unwrap();
        let parts: Vec<&str> = sf.split(',').collect();
        assert_eq!(parts.len(), 3, "{sf}");
        let nonce = parts[0].strip_prefix("r=abcdefghijklmnopqrstuvwx").unwrap();
        assert_eq!(nonce.len(), 24);
        assert_eq!(STANDARD.decode(nonce).unwrap().len(), 18);
        assert_eq!(parts[1], format!("s={}", v.scram.salt));
        assert_eq!(parts[2], "i=4096");
    }

    #[test]
    fn rfc7677_vector() {
        // RFC 7677 section 3, with the server nonce pinned.
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let v = ScramVerifier::derive(b"pencil", &salt, 4096);
        let (state, sf) = start_with_nonce(
            &v,
            b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        )
        .unwrap();
        assert_eq!(
            sf,
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let sfin = state
            .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        assert_eq!(sfin, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    #[test]
    fn channel_binding_p_is_unsupported() {
        let v = Verifier::from_secret("pw");
        for cf in [&b"p=tls-server-end-point,,n=,r=abc"[..], b"p=,,n=,r=abc"] {
            assert!(matches!(
                ScramServer::start(&v.scram, cf),
                Err(ScramError::ChannelBindingUnsupported)
            ));
        }
        let real = client_first(ChannelBinding::tls_server_end_point(vec![1, 2, 3]));
        assert!(matches!(
            ScramServer::start(&v.scram, &real),
            Err(ScramError::ChannelBindingUnsupported)
        ));
    }

    #[test]
    fn malformed_client_first() {
        let v = Verifier::from_secret("pw");
        let huge = vec![b'a'; 1 << 20];
        let long_nonce = format!("n,,n=,r={}", "a".repeat(MAX_NONCE_LEN + 1));
        let cases: Vec<&[u8]> = vec![
            b"",
            b",",
            b"garbage",
            b"n",
            b"n,",
            b"n,,",
            b"n,,n=",
            b"n,,r=abc",
            b"n,,n=,",
            b"n,,n=,r=",
            b"n,,n=,r=a b",
            b"n,,n=,r=abc\x7f",
            b"n,,n=,x=abc",
            b"n,a=admin,n=,r=abc",
            b"m=ext,,n=,r=abc",
            b"n,,m=ext,n=,r=abc",
            b"x,,n=,r=abc",
            b"nn,,n=,r=abc",
            b"n,,n=,r=abc,bogus",
            b"n,,n=,r=abc,=x",
            b"n,,n=,r=\xff\xfe",
            b"\xff,,n=,r=abc",
            b"n,,n=\xc3,r=abc",
            long_nonce.as_bytes(),
            &huge,
        ];
        for cf in cases {
            let r = ScramServer::start(&v.scram, cf);
            assert!(
                matches!(r, Err(ScramError::Malformed(_))),
                "{:?} -> {:?}",
                String::from_utf8_lossy(&cf[..cf.len().min(40)]),
                r.map(|(_, m)| m)
            );
        }
        // Extensions after the nonce are allowed.
        assert!(ScramServer::start(&v.scram, b"n,,n=,r=abc,x=1").is_ok());
    }

    /// A fresh server state for client nonce "abc", plus the combined nonce.
    /// The server nonce is pinned so that every state expects the same r=.
    fn started(v: &ScramVerifier) -> (ScramServerFirst, String) {
        let (state, sf) = start_with_nonce(v, b"n,,n=,r=abc", "c2VydmVybm9uY2U").unwrap();
        let sf = String::from_utf8(sf).unwrap();
        let nonce = sf.split(',').next().unwrap()[2..].to_owned();
        (state, nonce)
    }

    #[test]
    fn malformed_client_final() {
        let v = Verifier::from_secret("pw");
        let proof = STANDARD.encode([0u8; 32]);
        let (_, n) = started(&v.scram);
        let huge = format!("c=biws,r={n},p={}", "A".repeat(1 << 20));
        let cases: Vec<String> = vec![
            "".into(),
            "garbage".into(),
            ",p=".into(),
            format!("c=biws,r={n}"),               // no proof
            format!("c=biws,p={proof}"),           // no nonce
            format!("r={n},p={proof}"),            // no c=
            format!("c=biws,r={n},p="),            // empty proof
            format!("c=biws,r={n},p=!!!!"),        // bad base64
            format!("c=biws,r={n},p=AAAA"),        // short proof
            format!("c=biws,r={n},p={proof}AAAA"), // bad padding / long
            format!("c=@@@@,r={n},p={proof}"),     // bad base64 c=
            format!("c=eSws,r={n},p={proof}"),     // y,, but we saw n,,
            format!("c=,r={n},p={proof}"),
            format!("c=biws,r={n},junk,p={proof}"),
            format!("c=biws,x={n},p={proof}"),
            format!("c=biws\u{e9},r={n},p={proof}"),
            huge,
        ];
        for cf in cases {
            let (state, _) = started(&v.scram);
            let r = state.finish(cf.as_bytes());
            assert!(
                matches!(r, Err(ScramError::Malformed(_))),
                "{cf:.60} -> {r:?}"
            );
        }
        let (state, _) = started(&v.scram);
        assert!(state.finish(b"c=biws,r=abc\xff,p=x").is_err());
    }

    #[test]
    fn wrong_nonce() {
        let v = Verifier::from_secret("pw");
        let proof = STANDARD.encode([0u8; 32]);
        let (_, n) = started(&v.scram);
        for bad in [
            "abc".to_owned(),            // client nonce only
            format!("{n}x"),             // extended
            n[..n.len() - 1].to_owned(), // truncated
            "".to_owned(),
        ] {
            let (state, _) = started(&v.scram);
            let r = state.finish(format!("c=biws,r={bad},p={proof}").as_bytes());
            assert!(
                matches!(r, Err(ScramError::NonceMismatch)),
                "{bad} -> {r:?}"
            );
        }
        // Another session's nonce does not work either.
        let (state, _) = ScramServer::start(&v.scram, b"n,,n=,r=abc").unwrap();
        let r = state.finish(format!("c=biws,r={n},p={proof}").as_bytes());
        assert!(matches!(r, Err(ScramError::NonceMismatch)), "{r:?}");
    }

    #[test]
    fn channel_binding_data_in_final_is_unsupported() {
        let v = Verifier::from_secret("pw");
        let (state, n) = started(&v.scram);
        let c = STANDARD.encode(b"p=tls-server-end-point,,\x01\x02");
        let proof = STANDARD.encode([0u8; 32]);
        let r = state.finish(format!("c={c},r={n},p={proof}").as_bytes());
        assert!(
            matches!(r, Err(ScramError::ChannelBindingUnsupported)),
            "{r:?}"
        );
    }

    #[test]
    fn corrupt_verifier_fails_as_bad_proof() {
        let secret = new_secret();
        let good = Verifier::from_secret(&secret).scram;
        let mut corrupt = vec![];
        for f in 0..5 {
            let mut v = good.clone();
            match f {
                0 => v.salt = "not base64!".into(),
                1 => v.salt = String::new(),
                2 => v.iterations = 0,
                3 => v.stored_key = STANDARD.encode([0u8; 31]),
                _ => v.server_key = "%%".into(),
            }
            corrupt.push(v);
        }
        for v in &corrupt {
            assert!(
                matches!(exchange(v, &secret), Err(ScramError::BadProof)),
                "{v:?}"
            );
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let v = Verifier::from_secret("pw").scram;
        let mut rng = StdRng::seed_from_u64(0x05a4_d917);
        let alphabet = b"nyp=,rcmxa0+/\xff\x00";
        for i in 0..20_000 {
            let len = rng.gen_range(0..64);
            let buf: Vec<u8> = if i % 2 == 0 {
                (0..len).map(|_| rng.gen()).collect()
            } else {
                // Bias towards SCRAM-looking bytes to get past the first checks.
                (0..len)
                    .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                    .collect()
            };
            let _ = ScramServer::start(&v, &buf);
            let (state, _) = started(&v);
            let _ = state.finish(&buf);
        }
    }

    #[test]
    fn mutated_messages_never_panic() {
        let secret = new_secret();
        let v = Verifier::from_secret(&secret).scram;
        let mut rng = StdRng::seed_from_u64(7);
        let mut client = ScramSha256::new(secret.as_bytes(), ChannelBinding::unsupported());
        let cf = client.message().to_vec();
        // Pinned server nonce so that each fresh state accepts the (unmutated) client-final.
        let server_nonce = "Zm9vYmFyYmF6cXV4cXV1eGNvcmdl";
        let (_, sf) = start_with_nonce(&v, &cf, server_nonce).unwrap();
        client.update(&sf).unwrap();
        let cfin = client.message().to_vec();
        let (state, _) = start_with_nonce(&v, &cf, server_nonce).unwrap();
        assert!(
            state.finish(&cfin).is_ok(),
            "unmutated message authenticates"
        );
        for _ in 0..5_000 {
            let mut m = if rng.gen() { cf.clone() } else { cfin.clone() };
            for _ in 0..rng.gen_range(1..4) {
                match rng.gen_range(0..3) {
                    0 if !m.is_empty() => {
                        let i = rng.gen_range(0..m.len());
                        m[i] = rng.gen();
                    }
                    1 if !m.is_empty() => {
                        let i = rng.gen_range(0..m.len());
                        m.truncate(i);
                    }
                    _ => {
                        let i = rng.gen_range(0..=m.len());
                        m.insert(i, rng.gen());
                    }
                }
            }
            let _ = ScramServer::start(&v, &m);
            let (state, _) = start_with_nonce(&v, &cf, server_nonce).unwrap();
            let r = state.finish(&m);
            // A changed client-final must never authenticate.
            if m != cfin {
                assert!(r.is_err(), "{:?}", String::from_utf8_lossy(&m));
            }
        }
    }
}
