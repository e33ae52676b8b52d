//! Live sessions of tokens across fronts sharing the Postgres registry, so that a token's
//! `max_connections` holds whichever fronts its sessions use: a row per open session
//! (`sandpit_sessions`, keyed by front and a number of the front's), and a lease per front
//! (`sandpit_front_leases`) that the front renews while it runs. A session counts only while
//! its front's lease is live, so the sessions of a front that died stop counting when its
//! lease runs out, with no one having to remove them.
//!
//! A session is admitted under a transaction-scoped advisory lock of its token, in one
//! round trip (one simple-query string: lock, then count and insert in a statement of its
//! own, which sees every session admitted before the lock was granted). Its commits do not
//! wait for the registry's WAL flush (`synchronous_commit = off`): a row lost to a registry
//! crash only under-counts a token's sessions until they end, and waiting for the flush cost
//! ~4 ms per session start here (`bench/fronts-log.sh`).

use std::time::Duration;

use super::postgres::{db, PgStore};
use super::RegistryError;

/// Tables, created by [`PgStore::sessions_schema`] when a front starts.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandpit_sessions (
    front text NOT NULL,
    id int8 NOT NULL,
    token text NOT NULL,
    PRIMARY KEY (front, id));
CREATE INDEX IF NOT EXISTS sandpit_sessions_token ON sandpit_sessions (token);
CREATE TABLE IF NOT EXISTS sandpit_front_leases (
    front text PRIMARY KEY,
    expires_at timestamptz NOT NULL);
";

/// A value as an SQL string literal (the admission is one simple-query string).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl PgStore {
    /// Create the tables if missing (under the registry's schema lock).
    pub async fn sessions_schema(&self) -> Result<(), RegistryError> {
        self.create_tables(SCHEMA, "creating the session tables")
            .await
    }

    /// Renew (or take) `front`'s lease for `ttl` from now, and forget the sessions of fronts
    /// whose lease ran out a while ago (they count for nothing already).
    pub async fn lease_renew(&self, front: &str, ttl: Duration) -> Result<(), RegistryError> {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let c = self.client().await?;
        c.execute(
            "INSERT INTO sandpit_front_leases (front, expires_at) \
             VALUES ($1, now() + make_interval(secs => $2::int8 / 1000.0)) \
             ON CONFLICT (front) DO UPDATE SET expires_at = EXCLUDED.expires_at",
            &[&front, &ms],
        )
        .await
        .map_err(|e| db("renewing the front's lease", e))?;
        c.execute(
            "DELETE FROM sandpit_sessions s WHERE NOT EXISTS (SELECT 1 FROM sandpit_front_leases l \
             WHERE l.front = s.front AND l.expires_at > now() - interval '10 minutes')",
            &[],
        )
        .await
        .map_err(|e| db("forgetting dead fronts' sessions", e))?;
        Ok(())
    }

    /// Forget every session row of `front` (it starts again: none of them is open).
    pub async fn sessions_forget_front(&self, front: &str) -> Result<u64, RegistryError> {
        self.client()
            .await?
            .execute("DELETE FROM sandpit_sessions WHERE front = $1", &[&front])
            .await
            .map_err(|e| db("forgetting the front's sessions", e))
    }

    /// Record session `id` of `front` for `token` if fewer than `max` sessions of the token
    /// are open on fronts with a live lease; false (nothing recorded) otherwise.
    pub async fn session_admit(
        &self,
        token: &str,
        front: &str,
        id: i64,
        max: u32,
    ) -> Result<bool, RegistryError> {
        let (t, f) = (literal(token), literal(front));
        let sql = format!(
            "BEGIN; SET LOCAL synchronous_commit = off; \
             SELECT pg_advisory_xact_lock(hashtextextended('sandpit-sessions:' || {t}, 0)); \
             INSERT INTO sandpit_sessions (front, id, token) SELECT {f}, {id}, {t} \
               WHERE (SELECT count(*) FROM sandpit_sessions s JOIN sandpit_front_leases l \
                      ON l.front = s.front WHERE s.token = {t} AND l.expires_at > now()) < {max}; \
             COMMIT"
        );
        let c = self.client().await?;
        let out = match c.simple_query(&sql).await {
            Ok(out) => out,
            Err(e) => {
                // A statement that failed after BEGIN leaves the transaction open: closed
                // here, so the pooled connection is clean for its next user.
                let _ = c.batch_execute("ROLLBACK").await;
                return Err(db("admitting a session", e));
            }
        };
        // BEGIN, SET, the lock's SELECT, the INSERT, COMMIT: the fourth count is the INSERT's.
        let inserted = out
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::CommandComplete(n) => Some(*n),
                _ => None,
            })
            .nth(3);
        Ok(inserted == Some(1))
    }

    /// Forget session `id` of `front` (it ended).
    pub async fn session_leave(&self, front: &str, id: i64) -> Result<(), RegistryError> {
        let sql = format!(
            "BEGIN; SET LOCAL synchronous_commit = off; \
             DELETE FROM sandpit_sessions WHERE front = {} AND id = {id}; COMMIT",
            literal(front)
        );
        let c = self.client().await?;
        if let Err(e) = c.simple_query(&sql).await {
            let _ = c.batch_execute("ROLLBACK").await;
            return Err(db("forgetting a session", e));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn literals_double_their_quotes() {
        assert_eq!(super::literal("sp_abc"), "'sp_abc'");
        assert_eq!(super::literal("a'b"), "'a''b'");
    }
}
