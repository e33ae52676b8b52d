//! The token store. The embedded default keeps one JSON file per token in the data dir
//! (`file`); replicas share one in a Postgres database (`postgres`). Either way reads are
//! served from an in-memory copy; with Postgres a miss reads the database (a token issued on
//! another replica a moment ago works at once) and changes made elsewhere arrive by
//! LISTEN/NOTIFY, with a periodic full re-read as the fallback.

pub mod claims;
pub mod end;
pub mod file;
pub mod limits;
pub mod pool;
pub mod postgres;
pub mod sessions;
pub mod workers;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::sync::mpsc;

use crate::auth::Verifier;
use file::FileStore;
use postgres::{HeldLock, PgRegistryConfig, PgStore};

/// Errors of the token store.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry i/o at {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("registry file {path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("token {0} already exists")]
    Exists(String),
    /// The shared registry's database failed or refused.
    #[error("token registry database: {0}")]
    Database(String),
    /// Every registry connection this front may use was busy for the whole wait.
    #[error("the token registry is busy: all {max} of this gateway's registry connections stayed in use for {waited:?} (registry.max_connections, registry.acquire_timeout)")]
    Busy {
        /// `registry.max_connections`.
        max: usize,
        /// `registry.acquire_timeout`.
        waited: Duration,
    },
}

/// Where a token is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenState {
    /// Issued, no backend yet.
    Issued,
    /// Has (or had) a backend and may connect.
    Live,
    /// TTL passed.
    Expired,
    /// Revoked by the harness.
    Revoked,
}

impl TokenState {
    /// Every state, in life order.
    pub const ALL: [TokenState; 4] = [
        TokenState::Issued,
        TokenState::Live,
        TokenState::Expired,
        TokenState::Revoked,
    ];

    /// Whether the token may still open sessions.
    pub fn is_usable(self) -> bool {
        matches!(self, TokenState::Issued | TokenState::Live)
    }

    /// The one spelling of a state: in records, the shared registry's `state` column,
    /// metrics labels and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenState::Issued => "issued",
            TokenState::Live => "live",
            TokenState::Expired => "expired",
            TokenState::Revoked => "revoked",
        }
    }

    /// The state spelled `s` (see [`TokenState::as_str`]).
    pub fn parse(s: &str) -> Option<TokenState> {
        TokenState::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl std::fmt::Display for TokenState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens when a result exceeds its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CapMode {
    /// Send the first rows, a notice, and a CommandComplete counting what was sent.
    #[default]
    Truncate,
    /// Fail the statement with SQLSTATE 54000 and send no rows.
    Error,
}

/// Per-token caps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caps {
    /// Rows per statement.
    pub max_rows: u64,
    /// Bytes of row data per statement.
    pub max_bytes: u64,
    /// Concurrent sessions.
    pub max_connections: u32,
    /// Truncate or fail capped results.
    #[serde(default)]
    pub cap_mode: CapMode,
    /// Seatbelt: statement kinds allowed (None = all). Unparsed statements are denied
    /// whenever this is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// `statement_timeout` of each session, ms (0 = none). Also enforced by the gateway.
    #[serde(default)]
    pub statement_timeout_ms: u64,
    /// `idle_in_transaction_session_timeout` of each session, ms (0 = none).
    #[serde(default)]
    pub idle_in_transaction_timeout_ms: u64,
}

/// Everything the gateway knows about one token. The secret itself is never stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public id (also the Postgres user name in the DSN).
    pub id: String,
    /// Task name given at issue.
    pub task: String,
    /// Free-form key/value metadata.
    pub metadata: BTreeMap<String, String>,
    /// When it was issued.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it expires.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// Caps.
    pub caps: Caps,
    /// State.
    pub state: TokenState,
    /// SHA-256 and SCRAM verifier of the secret.
    pub verifier: Verifier,
    /// The provider's handle of its backend, once forked.
    pub backend: Option<String>,
    /// How many times a backend was forked for it (1 at most, unless its backend vanished).
    pub fork_count: u64,
    /// Golden version its backend was copied from (providers with versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
    /// Its sessions log in as a superuser of its own backend (only providers whose backend
    /// is a whole throwaway machine issue such tokens: `microvm`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superuser: bool,
    /// When it was expired or revoked.
    #[serde(with = "time::serde::rfc3339::option", default)]
    pub ended_at: Option<OffsetDateTime>,
    /// How far its end has got ([`end`]; None while usable, and in records of tokens that
    /// ended before ends were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<end::EndPhase>,
    /// Why its end-of-token review failed, the last time it was tried; cleared when one is
    /// stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_error: Option<String>,
    /// Why it was ended, when not by its TTL or the harness (e.g. its worker was lost);
    /// told to a client that connects with it afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_why: Option<String>,
}

#[cfg(test)]
impl TokenRecord {
    /// A live token with tiny caps, for table tests.
    pub fn for_tests(id: &str) -> TokenRecord {
        let now = OffsetDateTime::now_utc();
        TokenRecord {
            id: id.into(),
            task: "task".into(),
            metadata: Default::default(),
            created_at: now,
            expires_at: now + time::Duration::seconds(60),
            caps: Caps {
                max_rows: 1,
                max_bytes: 1,
                max_connections: 1,
                cap_mode: Default::default(),
                allow: None,
                statement_timeout_ms: 0,
                idle_in_transaction_timeout_ms: 0,
            },
            state: TokenState::Live,
            verifier: crate::auth::Verifier::from_secret("s"),
            backend: None,
            golden: None,
            fork_count: 0,
            superuser: false,
            ended_at: None,
            end: None,
            review_error: None,
            ended_why: None,
        }
    }
}

enum Store {
    File(FileStore),
    Postgres(Arc<PgStore>),
}

/// A lock held across replicas (nothing to hold with the file store: one process owns it).
pub struct TokenLock {
    _held: Option<HeldLock>,
}

/// The token store with its in-memory copy.
pub struct Registry {
    cache: Arc<DashMap<String, TokenRecord>>,
    store: Store,
    changes: std::sync::Mutex<Option<mpsc::UnboundedReceiver<TokenRecord>>>,
    follower: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(f) = &self.follower {
            f.abort();
        }
    }
}

impl Registry {
    /// Open (or create) the embedded registry under `dir`, loading every token file.
    pub fn open(dir: &Path) -> Result<Registry, RegistryError> {
        let cache = Arc::new(DashMap::new());
        let store = FileStore::open(dir, &cache)?;
        Ok(Registry {
            cache,
            store: Store::File(store),
            changes: std::sync::Mutex::new(None),
            follower: None,
        })
    }

    /// Connect to the shared registry, create its tables if needed, load every token, and
    /// follow changes made by other replicas (LISTEN/NOTIFY, and a re-read of the rows
    /// changed since the last one every `refresh`). Changed records are offered once through [`Registry::take_changes`].
    pub async fn open_postgres(
        cfg: &PgRegistryConfig,
        refresh: Duration,
    ) -> Result<Registry, RegistryError> {
        let store = Arc::new(PgStore::open(cfg).await?);
        let cache = Arc::new(DashMap::new());
        let (all, since) = store.changed_since(None).await?;
        for rec in all {
            cache.insert(rec.id.clone(), rec);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let follower = tokio::spawn(follow(store.clone(), cache.clone(), tx, refresh, since));
        Ok(Registry {
            cache,
            store: Store::Postgres(store),
            changes: std::sync::Mutex::new(Some(rx)),
            follower: Some(follower),
        })
    }

    /// Whether several gateways share this registry.
    pub fn is_shared(&self) -> bool {
        matches!(self.store, Store::Postgres(_))
    }

    /// The shared store, for cancel keys and settings (None for the file store).
    pub fn shared(&self) -> Option<&Arc<PgStore>> {
        match &self.store {
            Store::Postgres(p) => Some(p),
            Store::File(_) => None,
        }
    }

    /// Records changed by other replicas (first caller only; None for the file store).
    pub fn take_changes(&self) -> Option<mpsc::UnboundedReceiver<TokenRecord>> {
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Store a new token (durably, before this returns).
    pub async fn insert(&self, rec: TokenRecord) -> Result<(), RegistryError> {
        match &self.store {
            Store::File(f) => f.insert(&self.cache, rec),
            Store::Postgres(p) => {
                p.insert(&rec).await?;
                self.cache.insert(rec.id.clone(), rec);
                Ok(())
            }
        }
    }

    /// A copy of one token from memory (may lag another replica's change by a round trip).
    pub fn get(&self, id: &str) -> Option<TokenRecord> {
        self.cache.get(id).map(|r| r.clone())
    }

    /// A copy of one token; with the shared store a token not in memory is read from the
    /// database (issued on another replica a moment ago).
    pub async fn lookup(&self, id: &str) -> Result<Option<TokenRecord>, RegistryError> {
        if let Some(r) = self.get(id) {
            return Ok(Some(r));
        }
        self.fresh(id).await
    }

    /// One token as stored now (the shared store is read, and memory updated).
    pub async fn fresh(&self, id: &str) -> Result<Option<TokenRecord>, RegistryError> {
        match &self.store {
            Store::File(_) => Ok(self.get(id)),
            Store::Postgres(p) => {
                let rec = p.get(id).await?;
                if let Some(r) = &rec {
                    self.cache.insert(r.id.clone(), r.clone());
                }
                Ok(rec)
            }
        }
    }

    /// Copies of all tokens in memory, oldest first.
    pub fn list(&self) -> Vec<TokenRecord> {
        let mut v: Vec<_> = self.cache.iter().map(|r| r.clone()).collect();
        sort(&mut v);
        v
    }

    /// All tokens as stored now, oldest first (the shared store is read).
    pub async fn list_fresh(&self) -> Result<Vec<TokenRecord>, RegistryError> {
        match &self.store {
            Store::File(_) => Ok(self.list()),
            Store::Postgres(p) => {
                let mut v = p.list().await?;
                for r in &v {
                    self.cache.insert(r.id.clone(), r.clone());
                }
                sort(&mut v);
                Ok(v)
            }
        }
    }

    /// Change a token and persist it; returns the new record (None if unknown). With the
    /// shared store the change is made under the row's lock, on the stored record.
    pub async fn update(
        &self,
        id: &str,
        f: impl FnOnce(&mut TokenRecord),
    ) -> Result<Option<TokenRecord>, RegistryError> {
        self.update_with(id, true, f).await
    }

    async fn update_with(
        &self,
        id: &str,
        sync_rename: bool,
        f: impl FnOnce(&mut TokenRecord),
    ) -> Result<Option<TokenRecord>, RegistryError> {
        match &self.store {
            Store::File(s) => s.update(&self.cache, id, sync_rename, f),
            Store::Postgres(p) => {
                let rec = p.update(id, f).await?;
                if let Some(r) = &rec {
                    self.cache.insert(id.to_string(), r.clone());
                }
                Ok(rec)
            }
        }
    }

    /// Record a first connection's claim: token `id` got `backend` (copied from `golden`).
    /// The file store appends one journal line and syncs nothing (a process crash loses no
    /// claim; a host crash may undo it, as it undoes the `fsync=off` server it names); call
    /// [`Registry::commit_claim`] with the returned ticket, off the first query's path, to
    /// make it durable. The shared store commits it in its transaction (ticket 0).
    pub async fn claim(
        &self,
        id: &str,
        backend: &str,
        golden: Option<String>,
    ) -> Result<Option<(TokenRecord, ClaimTicket)>, RegistryError> {
        match &self.store {
            Store::File(s) => Ok(s
                .claim(&self.cache, id, backend, golden)?
                .map(|(r, seq)| (r, ClaimTicket(seq)))),
            Store::Postgres(_) => Ok(self
                .update(id, |r| claims::claim(r, backend, golden))
                .await?
                .map(|r| (r, ClaimTicket(0)))),
        }
    }

    /// Make a claim durable; claims waiting together share one sync (group commit).
    pub async fn commit_claim(&self, ticket: ClaimTicket) -> Result<(), RegistryError> {
        match &self.store {
            Store::File(s) => s.commit_claims(&self.cache, ticket.0).await,
            Store::Postgres(_) => Ok(()),
        }
    }

    /// The cross-replica lock of one token: held around a fork and a destroy, so that two
    /// replicas never fork twice or destroy what the other just recorded.
    pub async fn lock_token(&self, id: &str) -> Result<TokenLock, RegistryError> {
        self.lock(&format!("token:{id}")).await
    }

    /// A named cross-replica lock (e.g. "janitor").
    pub async fn lock(&self, name: &str) -> Result<TokenLock, RegistryError> {
        match &self.store {
            Store::File(_) => Ok(TokenLock { _held: None }),
            Store::Postgres(p) => Ok(TokenLock {
                _held: Some(p.lock(name).await?),
            }),
        }
    }
}

/// What [`Registry::commit_claim`] makes durable (a journal position; 0: nothing left to do).
#[derive(Debug, Clone, Copy)]
pub struct ClaimTicket(u64);

fn sort(v: &mut [TokenRecord]) {
    v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
}

/// Keeps memory in step with the shared store: a re-read of the token named by each
/// notification, and of what changed since the last re-read at (re)connect and every
/// `refresh`.
async fn follow(
    store: Arc<PgStore>,
    cache: Arc<DashMap<String, TokenRecord>>,
    tx: mpsc::UnboundedSender<TokenRecord>,
    refresh: Duration,
    since: OffsetDateTime,
) {
    let mut f = Follower {
        store,
        cache,
        tx,
        since: Some(since),
    };
    loop {
        match f.store.listen().await {
            Ok((_client, mut ids)) => {
                tracing::debug!("following the shared token registry");
                // Anything missed while not listening.
                f.refresh().await;
                let mut tick = tokio::time::interval(refresh.max(Duration::from_millis(100)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tokio::select! {
                        id = ids.recv() => {
                            let Some(id) = id else { break };
                            f.reread(&id).await;
                        }
                        _ = tick.tick() => f.refresh().await,
                    }
                }
                tracing::warn!("lost the registry change feed; reconnecting");
            }
            Err(e) => tracing::warn!(error = %e, "cannot follow the token registry; retrying"),
        }
        metrics::counter!("sandpit_registry_reconnects_total").increment(1);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

struct Follower {
    store: Arc<PgStore>,
    cache: Arc<DashMap<String, TokenRecord>>,
    tx: mpsc::UnboundedSender<TokenRecord>,
    since: Option<OffsetDateTime>,
}

impl Follower {
    /// Every change read is passed on, even when memory already holds it: this process's
    /// own reads (a session's lookup, a losing `update`) may have cached another replica's
    /// change before its notification came, and the followers must still act on it (they
    /// are idempotent).
    fn offer(&self, rec: TokenRecord) {
        self.cache.insert(rec.id.clone(), rec.clone());
        let _ = self.tx.send(rec);
    }

    async fn reread(&self, id: &str) {
        match self.store.get(id).await {
            Ok(Some(rec)) => self.offer(rec),
            Ok(None) => {}
            Err(e) => tracing::warn!(token = %id, error = %e, "reading a changed token failed"),
        }
    }

    async fn refresh(&mut self) {
        match self.store.changed_since(self.since).await {
            Ok((recs, now)) => {
                for rec in recs {
                    self.offer(rec);
                }
                self.since = Some(now);
            }
            Err(e) => tracing::warn!(error = %e, "re-reading the token registry failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TokenState;

    #[test]
    fn state_spelling_is_the_records_and_parses_back() {
        for s in TokenState::ALL {
            let json = serde_json::to_value(s).unwrap();
            assert_eq!(json, s.as_str());
            assert_eq!(TokenState::parse(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(TokenState::parse("ended"), None);
    }
}
