//! SCRAM-SHA-256 as a client of a backend, with the keys a password derives cached. Each
//! login to a backend would otherwise run PBKDF2 (4096 HMAC-SHA-256 by default) on the
//! gateway: under a flood of new connections that was most of a login's gateway CPU, taken
//! from every other session. What SCRAM lets a client keep is a pure function of (password,
//! salt, iteration count): ClientKey and ServerKey. They are cached under a digest of exactly
//! those inputs (and the role), so a changed password or salt never finds an old entry; the
//! cache is bounded (oldest out first), and a miss derives off the async workers, at most
//! [`DERIVE_SLOTS`] at a time.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{LazyLock, Mutex};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use rand::Rng;
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Entries kept; past this the oldest goes (one entry per role and password in use).
const MAX_ENTRIES: usize = 4096;
/// Highest iteration count accepted from a backend (as postgres-protocol: a hostile server
/// must not make the gateway loop at will).
const MAX_ITERATIONS: u32 = 100_000;
/// PBKDF2 derivations running at once (each on a blocking thread).
pub const DERIVE_SLOTS: usize = 2;

/// What a password derives for one salt and iteration count.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ScramKeys {
    /// HMAC(SaltedPassword, "Client Key").
    pub client_key: [u8; 32],
    /// HMAC(SaltedPassword, "Server Key").
    pub server_key: [u8; 32],
}

impl ScramKeys {
    /// PBKDF2 and the two HMACs: the expensive part, run on the caller's thread.
    pub fn derive(password: &[u8], salt: &[u8], iterations: u32) -> ScramKeys {
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut salted);
        ScramKeys {
            client_key: hmac(&salted, b"Client Key"),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    /// The verifier PostgreSQL stores for these keys (`ALTER ROLE … PASSWORD '<this>'`).
    pub fn verifier(&self, salt: &[u8], iterations: u32) -> String {
        format!(
            "SCRAM-SHA-256${iterations}:{}${}:{}",
            STANDARD.encode(salt),
            STANDARD.encode(Sha256::digest(self.client_key)),
            STANDARD.encode(self.server_key)
        )
    }
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length, so this cannot fail.
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

/// The cache's key: a digest of every input the keys depend on, length-prefixed so no two
/// input tuples share an encoding (the password itself is not kept).
fn cache_key(user: &str, password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [user.as_bytes(), password, salt] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(iterations.to_be_bytes());
    h.finalize().into()
}

#[derive(Default)]
struct KeyCache {
    map: HashMap<[u8; 32], ScramKeys>,
    order: VecDeque<[u8; 32]>,
}

static CACHE: LazyLock<Mutex<KeyCache>> = LazyLock::new(Mutex::default);
static DERIVING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(DERIVE_SLOTS);

fn cached(k: &[u8; 32]) -> Option<ScramKeys> {
    let c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    c.map.get(k).copied()
}

impl KeyCache {
    /// Adds an entry; past `max`, the oldest go.
    fn insert(&mut self, k: [u8; 32], keys: ScramKeys, max: usize) {
        if self.map.insert(k, keys).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > max {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

fn remember(k: [u8; 32], keys: ScramKeys) {
    let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    c.insert(k, keys, MAX_ENTRIES);
}

/// Whether the keys for these inputs are cached (tests; the bound).
pub fn is_cached(user: &str, password: &[u8], salt: &[u8], iterations: u32) -> bool {
    cached(&cache_key(user, password, salt, iterations)).is_some()
}

/// The keys of `password` for `user` under this salt and count: from the cache, or derived
/// on a blocking thread (at most [`DERIVE_SLOTS`] at once) and remembered.
pub async fn keys(
    user: &str,
    password: &[u8],
    salt: &[u8],
    iterations: u32,
) -> io::Result<ScramKeys> {
    if iterations == 0 || iterations > MAX_ITERATIONS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("SCRAM iteration count {iterations} out of range"),
        ));
    }
    let k = cache_key(user, password, salt, iterations);
    if let Some(keys) = cached(&k) {
        return Ok(keys);
    }
    let _slot = DERIVING
        .acquire()
        .await
        .map_err(|_| io::Error::other("SCRAM derivation closed"))?;
    // Another login may have derived it while this one waited for a slot.
    if let Some(keys) = cached(&k) {
        return Ok(keys);
    }
    let (p, s) = (password.to_vec(), salt.to_vec());
    let keys = tokio::task::spawn_blocking(move || ScramKeys::derive(&p, &s, iterations))
        .await
        .map_err(|e| io::Error::other(format!("SCRAM derivation: {e}")))?;
    remember(k, keys);
    Ok(keys)
}

/// A fresh verifier for `password` (random 16-byte salt), its keys put in the cache for
/// `user` so the next login with it costs no PBKDF2.
pub async fn new_verifier(user: &str, password: &str, iterations: u32) -> io::Result<String> {
    let mut salt = [0u8; 16];
    rand::thread_rng().fill(&mut salt);
    let keys = keys(user, password.as_bytes(), &salt, iterations).await?;
    Ok(keys.verifier(&salt, iterations))
}

/// Where one exchange is.
enum State {
    /// Client-first sent; the nonce in it.
    First {
        nonce: String,
    },
    /// Client-final sent: what the server's signature must match.
    Final {
        server_key: [u8; 32],
        auth_message: String,
    },
    Done,
}

/// One SCRAM-SHA-256 exchange (no channel binding), for `user`'s `password`. A password that
/// is not printable ASCII (which SASLprep could change) goes through postgres-protocol's
/// client, uncached.
pub struct ScramClient {
    user: String,
    password: String,
    message: Vec<u8>,
    state: State,
    plain: Option<ScramSha256>,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("SCRAM: {what}"))
}

impl ScramClient {
    /// Starts an exchange; [`ScramClient::message`] is the client-first message.
    pub fn new(user: &str, password: &str) -> ScramClient {
        if !password.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            let s = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
            return ScramClient {
                user: String::new(),
                password: String::new(),
                message: s.message().to_vec(),
                state: State::Done,
                plain: Some(s),
            };
        }
        // Printable ASCII but ',' (RFC 5802's nonce alphabet).
        let mut rng = rand::thread_rng();
        let nonce: String = (0..24)
            .map(|_| match rng.gen_range(0x21u8..0x7f) {
                b',' => '~',
                b => b as char,
            })
            .collect();
        ScramClient {
            user: user.to_string(),
            password: password.to_string(),
            message: format!("n,,n=,r={nonce}").into_bytes(),
            state: State::First { nonce },
            plain: None,
        }
    }

    /// The message to send now.
    pub fn message(&self) -> &[u8] {
        &self.message
    }

    /// Takes the server-first message; [`ScramClient::message`] is then the client-final one.
    pub async fn update(&mut self, server_first: &[u8]) -> io::Result<()> {
        if let Some(p) = self.plain.as_mut() {
            p.update(server_first)?;
            self.message = p.message().to_vec();
            return Ok(());
        }
        let State::First { nonce } = std::mem::replace(&mut self.state, State::Done) else {
            return Err(bad("server-first out of order"));
        };
        let text = std::str::from_utf8(server_first).map_err(|_| bad("server-first not UTF-8"))?;
        let mut parts = text.split(',');
        let (r, s, i) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(r), Some(s), Some(i), None) => (r, s, i),
            _ => return Err(bad("malformed server-first")),
        };
        let server_nonce = r.strip_prefix("r=").ok_or_else(|| bad("no nonce"))?;
        if !server_nonce.starts_with(&nonce) || server_nonce.len() == nonce.len() {
            return Err(bad("server nonce does not extend ours"));
        }
        let salt = s
            .strip_prefix("s=")
            .and_then(|s| STANDARD.decode(s).ok())
            .ok_or_else(|| bad("bad salt"))?;
        let iterations: u32 = i
            .strip_prefix("i=")
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| bad("bad iteration count"))?;
        let keys = keys(&self.user, self.password.as_bytes(), &salt, iterations).await?;
        let without_proof = format!("c=biws,r={server_nonce}");
        let auth_message = format!("n=,r={nonce},{text},{without_proof}");
        let stored_key: [u8; 32] = Sha256::digest(keys.client_key).into();
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let mut proof = keys.client_key;
        for (p, s) in proof.iter_mut().zip(signature) {
            *p ^= s;
        }
        self.message = format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes();
        self.state = State::Final {
            server_key: keys.server_key,
            auth_message,
        };
        Ok(())
    }

    /// Checks the server-final message: the server proves it knew the verifier.
    pub fn finish(&mut self, server_final: &[u8]) -> io::Result<()> {
        if let Some(p) = self.plain.as_mut() {
            return p.finish(server_final);
        }
        let State::Final {
            server_key,
            auth_message,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(bad("server-final out of order"));
        };
        let text = std::str::from_utf8(server_final).map_err(|_| bad("server-final not UTF-8"))?;
        if let Some(e) = text.strip_prefix("e=") {
            return Err(bad(&format!("server error {e:?}")));
        }
        let given = text
            .strip_prefix("v=")
            .and_then(|v| STANDARD.decode(v).ok())
            .ok_or_else(|| bad("malformed server-final"))?;
        let mut m = <HmacSha256 as Mac>::new_from_slice(&server_key).expect("any key length");
        m.update(auth_message.as_bytes());
        m.verify_slice(&given)
            .map_err(|_| bad("the server's signature does not match"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's side of one exchange against `verifier_keys`: the client-final message
    /// checked as PostgreSQL does, and the server-final message (or None: proof refused).
    fn serve(
        client_first: &[u8],
        keys: &ScramKeys,
        salt: &[u8],
        iterations: u32,
    ) -> (String, impl Fn(&[u8]) -> Option<String>) {
        let first = std::str::from_utf8(client_first).unwrap();
        let bare = first.strip_prefix("n,,").unwrap().to_string();
        let cnonce = bare.strip_prefix("n=,r=").unwrap().to_string();
        let server_first = format!(
            "r={cnonce}SRVNONCE,s={},i={iterations}",
            STANDARD.encode(salt)
        );
        let stored: [u8; 32] = Sha256::digest(keys.client_key).into();
        let server_key = keys.server_key;
        let sf = server_first.clone();
        let check = move |client_final: &[u8]| {
            let text = std::str::from_utf8(client_final).unwrap();
            let (without, proof) = text.rsplit_once(",p=").unwrap();
            let auth = format!("{bare},{sf},{without}");
            let sig = hmac(&stored, auth.as_bytes());
            let proof = STANDARD.decode(proof).unwrap();
            let client_key: Vec<u8> = proof.iter().zip(sig).map(|(p, s)| p ^ s).collect();
            (<[u8; 32]>::from(Sha256::digest(&client_key)) == stored)
                .then(|| format!("v={}", STANDARD.encode(hmac(&server_key, auth.as_bytes()))))
        };
        (server_first, check)
    }

    async fn exchange(user: &str, password: &str, server_pw: &str, salt: &[u8]) -> io::Result<()> {
        let server_keys = ScramKeys::derive(server_pw.as_bytes(), salt, 4096);
        let mut c = ScramClient::new(user, password);
        let (server_first, check) = serve(c.message(), &server_keys, salt, 4096);
        c.update(server_first.as_bytes()).await?;
        match check(c.message()) {
            Some(v) => c.finish(v.as_bytes()),
            None => Err(bad("proof refused")),
        }
    }

    #[tokio::test]
    async fn logs_in_then_hits_the_cache_and_never_reuses_a_stale_key() {
        let salt = b"salt-one-16bytes";
        assert!(!is_cached("u1", b"pw-one", salt, 4096));
        exchange("u1", "pw-one", "pw-one", salt)
            .await
            .expect("login");
        assert!(is_cached("u1", b"pw-one", salt, 4096));
        exchange("u1", "pw-one", "pw-one", salt)
            .await
            .expect("cached login");
        // A changed password, salt or count is another entry; the old one proves nothing.
        assert!(!is_cached("u1", b"pw-two", salt, 4096));
        assert!(!is_cached("u1", b"pw-one", b"salt-two-16bytes", 4096));
        assert!(!is_cached("u1", b"pw-one", salt, 4097));
        assert!(!is_cached("u2", b"pw-one", salt, 4096));
        let e = exchange("u1", "pw-one", "pw-two", salt)
            .await
            .expect_err("server has pw-two");
        assert!(e.to_string().contains("proof refused"), "{e}");
        exchange("u1", "pw-two", "pw-two", b"salt-two-16bytes")
            .await
            .expect("new password");
        let k = keys("u1", b"pw-one", salt, 4096).await.unwrap();
        assert_eq!(k, ScramKeys::derive(b"pw-one", salt, 4096));
    }

    #[tokio::test]
    async fn non_ascii_passwords_take_the_uncached_client() {
        let salt = b"salt-non-ascii!!";
        exchange("u3", "p\u{e4}ssw\u{f6}rd", "p\u{e4}ssw\u{f6}rd", salt)
            .await
            .expect("login");
        assert!(!is_cached(
            "u3",
            "p\u{e4}ssw\u{f6}rd".as_bytes(),
            salt,
            4096
        ));
    }

    #[tokio::test]
    async fn refuses_what_a_hostile_server_sends() {
        for (name, first) in [
            ("nonce not extended", "r=zzz,s=c2FsdA==,i=4096".to_string()),
            ("huge count", "r={n}x,s=c2FsdA==,i=100000000".to_string()),
            ("zero count", "r={n}x,s=c2FsdA==,i=0".to_string()),
            ("bad salt", "r={n}x,s=!!,i=4096".to_string()),
            ("extension", "r={n}x,s=c2FsdA==,i=4096,m=1".to_string()),
            ("same nonce", "r={n},s=c2FsdA==,i=4096".to_string()),
        ] {
            let mut c = ScramClient::new("u4", "pw");
            let n = std::str::from_utf8(c.message())
                .unwrap()
                .strip_prefix("n,,n=,r=")
                .unwrap()
                .to_string();
            let first = first.replace("{n}", &n);
            assert!(c.update(first.as_bytes()).await.is_err(), "{name}");
        }
        // A server that does not know the verifier cannot sign.
        let mut c = ScramClient::new("u4", "pw");
        let keys = ScramKeys::derive(b"pw", b"s", 4096);
        let (sf, _) = serve(c.message(), &keys, b"s", 4096);
        c.update(sf.as_bytes()).await.unwrap();
        assert!(c.finish(b"v=AAAA").is_err());
        assert!(c.finish(b"v=AAAA").is_err(), "out of order");
    }

    #[tokio::test]
    async fn verifier_matches_postgres_protocol_and_seeds_the_cache() {
        let v = new_verifier("u5", "secret", 4096).await.unwrap();
        let (head, keys) = v.split_once('$').unwrap().1.split_once('$').unwrap();
        let (iters, salt) = head.split_once(':').unwrap();
        assert_eq!(iters, "4096");
        let salt = STANDARD.decode(salt).unwrap();
        assert!(is_cached("u5", b"secret", &salt, 4096));
        let k = ScramKeys::derive(b"secret", &salt, 4096);
        assert_eq!(v, k.verifier(&salt, 4096));
        assert!(keys.contains(':'));
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut c = KeyCache::default();
        let zero = ScramKeys {
            client_key: [0; 32],
            server_key: [0; 32],
        };
        for i in 0..60u32 {
            c.insert(cache_key("bound", &i.to_be_bytes(), b"s", 1), zero, 50);
            // The same entry again is no second slot.
            c.insert(cache_key("bound", &i.to_be_bytes(), b"s", 1), zero, 50);
        }
        assert_eq!((c.map.len(), c.order.len()), (50, 50));
        let newest = cache_key("bound", &59u32.to_be_bytes(), b"s", 1);
        let oldest = cache_key("bound", &0u32.to_be_bytes(), b"s", 1);
        assert!(c.map.contains_key(&newest) && !c.map.contains_key(&oldest));
    }
}
