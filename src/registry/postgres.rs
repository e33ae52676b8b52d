//! The shared token store: tables in a Postgres database that every gateway replica uses.
//! Each write is one transaction (read-modify-write under `FOR UPDATE`), and a trigger
//! NOTIFYs `sandpit_tokens` with the token id on every insert and update, so replicas learn
//! of changes (a revoke, a fork) within a round trip. Cross-replica mutual exclusion (one fork
//! per token, one janitor pass at a time) is a session advisory lock held on a connection of
//! its own, released when that connection closes — also when the holder dies.

use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio_postgres::config::Host;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls};

use super::pool::{Idle, Pool, PoolLimits};
use super::{RegistryError, TokenRecord};
use crate::pgconn::stream::{self as backend_stream, BackendStream};
use crate::pgconn::tls::{self as btls, SslMode};
use crate::pgconn::{BackendAddr, Endpoint};

/// NOTIFY channel of token changes.
pub const CHANNEL: &str = "sandpit_tokens";

/// One statement per line; run once per start under a transaction-scoped advisory lock, so
/// replicas starting together do not race on `CREATE … IF NOT EXISTS`.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandpit_tokens (
    id text PRIMARY KEY,
    state text NOT NULL,
    record jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX IF NOT EXISTS sandpit_tokens_updated_at ON sandpit_tokens (updated_at);
CREATE TABLE IF NOT EXISTS sandpit_settings (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS sandpit_cancel_keys (
    pid int4 NOT NULL,
    secret int4 NOT NULL,
    token text NOT NULL,
    backend_pid int4 NOT NULL,
    backend_secret int4 NOT NULL,
    replica text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pid, secret));
CREATE OR REPLACE FUNCTION sandpit_tokens_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('sandpit_tokens', NEW.id); RETURN NULL; END $$;
CREATE OR REPLACE TRIGGER sandpit_tokens_notify AFTER INSERT OR UPDATE ON sandpit_tokens
    FOR EACH ROW EXECUTE FUNCTION sandpit_tokens_notify();
";

/// Where the shared registry lives and how to reach it.
#[derive(Debug, Clone)]
pub struct PgRegistryConfig {
    /// `postgresql://user:password@host:port/database`.
    pub url: String,
    /// TLS; None = the URL's `sslmode` (require → require, else disable).
    pub sslmode: Option<SslMode>,
    /// CA to verify the server with.
    pub ca_file: Option<std::path::PathBuf>,
    /// Connections running queries at once, and how long a query waits for one.
    pub pool: PoolLimits,
}

/// Where a CancelRequest for a minted key goes: the token (whose backend any replica can
/// reach) and the real key of the backend process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCancel {
    /// Token of the session.
    pub token: String,
    /// Real backend pid.
    pub pid: i32,
    /// Real backend secret.
    pub secret: i32,
}

/// Connection settings and the bounded pool of connections.
pub struct PgStore {
    cfg: tokio_postgres::Config,
    endpoint: Endpoint,
    pool: Pool,
}

/// A pooled connection and its query slot, given back on drop unless it broke.
pub struct Pooled<'a> {
    store: &'a PgStore,
    client: Option<Client>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().expect("present until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            self.store.pool.idle().give_back(c);
        }
    }
}

/// A cross-replica lock, released when dropped: unlocked and its connection given back to
/// the pool, or (no runtime, or the unlock failed) its connection closed, which releases it.
pub struct HeldLock {
    client: Option<Client>,
    key: i64,
    idle: Idle,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let Some(c) = self.client.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (key, idle) = (self.key, self.idle.clone());
        rt.spawn(async move {
            // Given back only once the server says it no longer holds the lock.
            if let Ok(row) = c.query_one("SELECT pg_advisory_unlock($1)", &[&key]).await {
                if row.try_get::<_, bool>(0).unwrap_or(false) {
                    idle.give_back(c);
                }
            }
        });
    }
}

pub(super) fn db(what: &str, e: tokio_postgres::Error) -> RegistryError {
    let detail = match e.as_db_error() {
        Some(d) => format!("{} (SQLSTATE {})", d.message(), d.code().code()),
        None => e.to_string(),
    };
    RegistryError::Database(format!("{what}: {detail}"))
}

fn corrupt(id: &str, e: impl std::fmt::Display) -> RegistryError {
    RegistryError::Database(format!("record of token {id} is corrupt: {e}"))
}

/// The advisory-lock key of a name (first 8 bytes of its SHA-256).
fn lock_key(name: &str) -> i64 {
    let d = Sha256::digest(format!("sandpit-registry:{name}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

fn state_text(rec: &TokenRecord) -> &'static str {
    rec.state.as_str()
}

fn decode(id: &str, v: serde_json::Value) -> Result<TokenRecord, RegistryError> {
    serde_json::from_value(v).map_err(|e| corrupt(id, e))
}

impl PgStore {
    /// Parse the URL, connect once, create the tables (idempotent).
    pub async fn open(c: &PgRegistryConfig) -> Result<PgStore, RegistryError> {
        let bad = |m: String| RegistryError::Database(format!("registry.url: {m}"));
        let cfg: tokio_postgres::Config = c.url.parse().map_err(|e| bad(format!("{e}")))?;
        if cfg.get_user().is_none() {
            return Err(bad("names no user".into()));
        }
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        let mode = c.sslmode.unwrap_or(match cfg.get_ssl_mode() {
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Disable,
        });
        let tls = btls::client_config(mode, c.ca_file.as_deref())
            .map_err(|e| RegistryError::Database(format!("registry TLS: {e}")))?;
        let endpoint = match cfg.get_hosts().first() {
            Some(Host::Tcp(h)) => Endpoint {
                addr: BackendAddr::Tcp {
                    host: h.clone(),
                    port,
                },
                tls: btls::for_host(&tls, h),
            },
            Some(Host::Unix(dir)) => Endpoint::unix(dir.join(format!(".s.PGSQL.{port}"))),
            None => return Err(bad("names no host".into())),
        };
        let store = PgStore {
            cfg,
            endpoint,
            pool: Pool::new(c.pool),
        };
        store
            .create_tables(SCHEMA, "creating the registry tables")
            .await?;
        Ok(store)
    }

    /// Runs `sql` (`CREATE … IF NOT EXISTS`) under the registry's schema lock, so replicas
    /// starting together do not race on it; `what` names it in an error.
    pub(super) async fn create_tables(&self, sql: &str, what: &str) -> Result<(), RegistryError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| db("begin", e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key("schema")])
            .await
            .map_err(|e| db("locking the schema", e))?;
        tx.batch_execute(sql).await.map_err(|e| db(what, e))?;
        tx.commit().await.map_err(|e| db("commit", e))
    }

    /// A fresh connection and its driver (the caller polls or spawns it).
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<BackendStream, NoTlsStream>), RegistryError> {
        let stream = backend_stream::open(&self.endpoint)
            .await
            .map_err(|e| RegistryError::Database(format!("connecting to the registry: {e}")))?;
        let mut cfg = self.cfg.clone();
        cfg.ssl_mode(tokio_postgres::config::SslMode::Disable)
            .application_name("sandpit-registry");
        cfg.connect_raw(stream, NoTls)
            .await
            .map_err(|e| db("registry login", e))
    }

    async fn spawned(&self) -> Result<Client, RegistryError> {
        let (client, conn) = self.connect().await?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "registry connection ended");
            }
        });
        Ok(client)
    }

    /// A pooled connection, once a query slot is free (`Busy` past `registry.acquire_timeout`).
    pub async fn client(&self) -> Result<Pooled<'_>, RegistryError> {
        let slot = self.pool.slot().await?;
        let client = match self.pool.idle().take() {
            Some(c) => c,
            None => self.spawned().await?,
        };
        Ok(Pooled {
            store: self,
            client: Some(client),
            _slot: slot,
        })
    }

    /// Query slots in use now.
    pub fn busy(&self) -> usize {
        self.pool.busy()
    }

    /// Wait for the cross-replica lock called `name`, on an idle connection when there is
    /// one (a fresh one if that one turns out to be dead).
    pub async fn lock(&self, name: &str) -> Result<HeldLock, RegistryError> {
        let key = lock_key(name);
        let sql = "SELECT pg_advisory_lock($1)";
        if let Some(c) = self.pool.idle().take() {
            match c.execute(sql, &[&key]).await {
                Ok(_) => return Ok(self.held(c, key)),
                Err(e) if e.as_db_error().is_some() => return Err(db("taking a registry lock", e)),
                Err(_) => {} // the idle connection had died: take a new one
            }
        }
        let c = self.spawned().await?;
        c.execute(sql, &[&key])
            .await
            .map_err(|e| db("taking a registry lock", e))?;
        Ok(self.held(c, key))
    }

    fn held(&self, client: Client, key: i64) -> HeldLock {
        HeldLock {
            client: Some(client),
            key,
            idle: self.pool.idle().clone(),
        }
    }

    /// The value of a setting, set to `init` first if no replica has set it yet.
    pub async fn setting_or_init(&self, name: &str, init: &str) -> Result<String, RegistryError> {
        let c = self.client().await?;
        c.execute(
            "INSERT INTO sandpit_settings (name, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&name, &init],
        )
        .await
        .map_err(|e| db("writing a setting", e))?;
        let row = c
            .query_one(
                "SELECT value FROM sandpit_settings WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(|e| db("reading a setting", e))?;
        Ok(row.get(0))
    }

    /// Insert a new token; `Exists` when the id is taken.
    pub async fn insert(&self, rec: &TokenRecord) -> Result<(), RegistryError> {
        let v = serde_json::to_value(rec).map_err(|e| corrupt(&rec.id, e))?;
        let n = self
            .client()
            .await?
            .execute(
                "INSERT INTO sandpit_tokens (id, state, record) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                &[&rec.id, &state_text(rec), &v],
            )
            .await
            .map_err(|e| db("inserting a token", e))?;
        if n == 0 {
            return Err(RegistryError::Exists(rec.id.clone()));
        }
        Ok(())
    }

    /// One token as stored now.
    pub async fn get(&self, id: &str) -> Result<Option<TokenRecord>, RegistryError> {
        let row = self
            .client()
            .await?
            .query_opt("SELECT record FROM sandpit_tokens WHERE id = $1", &[&id])
            .await
            .map_err(|e| db("reading a token", e))?;
        row.map(|r| decode(id, r.get(0))).transpose()
    }

    /// Every token as stored now.
    pub async fn list(&self) -> Result<Vec<TokenRecord>, RegistryError> {
        let rows = self
            .client()
            .await?
            .query("SELECT id, record FROM sandpit_tokens", &[])
            .await
            .map_err(|e| db("listing tokens", e))?;
        rows.into_iter()
            .map(|r| {
                let id: String = r.get(0);
                decode(&id, r.get(1))
            })
            .collect()
    }

    /// Tokens changed since `since` (all when None), and the server's time before the read:
    /// the `since` of the next call. A minute's margin covers transactions that began before
    /// that time and committed after the read (updates are single short transactions).
    pub async fn changed_since(
        &self,
        since: Option<OffsetDateTime>,
    ) -> Result<(Vec<TokenRecord>, OffsetDateTime), RegistryError> {
        let c = self.client().await?;
        let now: OffsetDateTime = c
            .query_one("SELECT now()", &[])
            .await
            .map_err(|e| db("reading the server time", e))?
            .get(0);
        let rows = match since {
            None => c.query("SELECT id, record FROM sandpit_tokens", &[]).await,
            Some(t) => {
                let from = t - time::Duration::minutes(1);
                c.query(
                    "SELECT id, record FROM sandpit_tokens WHERE updated_at >= $1",
                    &[&from],
                )
                .await
            }
        }
        .map_err(|e| db("listing tokens", e))?;
        let recs = rows
            .into_iter()
            .map(|r| {
                let id: String = r.get(0);
                decode(&id, r.get(1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((recs, now))
    }

    /// Read-modify-write of one token in a transaction holding its row lock, so concurrent
    /// changes from any replica apply one after the other.
    pub async fn update(
        &self,
        id: &str,
        f: impl FnOnce(&mut TokenRecord),
    ) -> Result<Option<TokenRecord>, RegistryError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| db("begin", e))?;
        let Some(row) = tx
            .query_opt(
                "SELECT record FROM sandpit_tokens WHERE id = $1 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(|e| db("reading a token", e))?
        else {
            return Ok(None);
        };
        let mut rec = decode(id, row.get(0))?;
        f(&mut rec);
        let v = serde_json::to_value(&rec).map_err(|e| corrupt(id, e))?;
        tx.execute(
            "UPDATE sandpit_tokens SET state = $2, record = $3, updated_at = now() WHERE id = $1",
            &[&id, &state_text(&rec), &v],
        )
        .await
        .map_err(|e| db("updating a token", e))?;
        tx.commit().await.map_err(|e| db("commit", e))?;
        Ok(Some(rec))
    }

    /// Record a minted cancel key; false when another replica holds the same key.
    pub async fn cancel_put(
        &self,
        key: (i32, i32),
        target: &SharedCancel,
        replica: &str,
    ) -> Result<bool, RegistryError> {
        let n = self
            .client()
            .await?
            .execute(
                "INSERT INTO sandpit_cancel_keys (pid, secret, token, backend_pid, backend_secret, replica) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                &[&key.0, &key.1, &target.token, &target.pid, &target.secret, &replica],
            )
            .await
            .map_err(|e| db("recording a cancel key", e))?;
        Ok(n == 1)
    }

    /// Where a minted key's cancel goes, if a replica recorded it.
    pub async fn cancel_get(&self, key: (i32, i32)) -> Result<Option<SharedCancel>, RegistryError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT token, backend_pid, backend_secret FROM sandpit_cancel_keys WHERE pid = $1 AND secret = $2",
                &[&key.0, &key.1],
            )
            .await
            .map_err(|e| db("reading a cancel key", e))?;
        Ok(row.map(|r| SharedCancel {
            token: r.get(0),
            pid: r.get(1),
            secret: r.get(2),
        }))
    }

    /// Sessions of a token still open on any replica (each holds a recorded cancel key).
    pub async fn open_sessions(&self, token: &str) -> Result<i64, RegistryError> {
        let row = self
            .client()
            .await?
            .query_one(
                "SELECT count(*) FROM sandpit_cancel_keys WHERE token = $1",
                &[&token],
            )
            .await
            .map_err(|e| db("counting a token's sessions", e))?;
        Ok(row.get(0))
    }

    /// Forget a minted key (its session ended).
    pub async fn cancel_remove(&self, key: (i32, i32)) -> Result<(), RegistryError> {
        self.client()
            .await?
            .execute(
                "DELETE FROM sandpit_cancel_keys WHERE pid = $1 AND secret = $2",
                &[&key.0, &key.1],
            )
            .await
            .map_err(|e| db("removing a cancel key", e))?;
        Ok(())
    }

    /// Remove keys whose sessions cannot exist any more: those of ended tokens, and those a
    /// replica left behind when it stopped (`replica`'s, at its start). Returns how many.
    pub async fn cancel_purge(&self, replica: Option<&str>) -> Result<u64, RegistryError> {
        let c = self.client().await?;
        let mut n = c
            .execute(
                "DELETE FROM sandpit_cancel_keys k USING sandpit_tokens t \
                 WHERE t.id = k.token AND t.state NOT IN ('issued', 'live')",
                &[],
            )
            .await
            .map_err(|e| db("purging cancel keys", e))?;
        if let Some(r) = replica {
            n += c
                .execute("DELETE FROM sandpit_cancel_keys WHERE replica = $1", &[&r])
                .await
                .map_err(|e| db("purging cancel keys", e))?;
        }
        Ok(n)
    }

    /// A connection LISTENing on the change channel; token ids arrive on the receiver, which
    /// closes when the connection ends.
    pub async fn listen(&self) -> Result<(Client, mpsc::UnboundedReceiver<String>), RegistryError> {
        let (client, mut conn) = self.connect().await?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if tx.send(n.payload().to_string()).is_err() {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "registry change feed ended");
                        break;
                    }
                    None => break,
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .map_err(|e| db("LISTEN", e))?;
        Ok((client, rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_differ_by_name_and_are_stable() {
        assert_eq!(lock_key("token:a"), lock_key("token:a"));
        assert_ne!(lock_key("token:a"), lock_key("token:b"));
        assert_ne!(lock_key("janitor"), lock_key("schema"));
    }
}
