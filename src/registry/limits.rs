//! Per-token limits kept in the shared registry, so that fronts sharing it limit a token as
//! one gateway would: the pace of its new sessions (`sandpit_session_pace`, a GCRA instant
//! per token) and authentication failures (`sandpit_auth_failures`, a sliding one-minute
//! window per key). Each is one statement per login or failure (an upsert that computes the
//! answer under the row's lock), timed by the registry server's clock so fronts' clocks need
//! not agree. Rows that no longer matter (a pace instant in the past, a window two minutes
//! old) are removed with each front's lease renewal.
//!
//! One gateway (no registry) never comes here: its limits stay in-process.

use std::time::Duration;

use super::postgres::{db, PgStore};
use super::RegistryError;

/// Tables, created by [`PgStore::limits_schema`] when a front starts.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandpit_session_pace (
    token text PRIMARY KEY,
    tat timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS sandpit_auth_failures (
    key text PRIMARY KEY,
    start timestamptz NOT NULL,
    current int4 NOT NULL,
    previous int4 NOT NULL);
";

/// The GCRA step of `lifecycle::pace::step` as one statement; `{now}` is the clock
/// (`statement_timestamp()`, one value for the whole statement). `$1` token, `$2` interval,
/// `$3` tolerance, `$4` max wait (microseconds). A row comes back when admitted, with the
/// wait in microseconds; none when refused (the instant is left as it was).
fn pace_sql(now: &str) -> String {
    let us = "* interval '1 microsecond'";
    format!(
        "INSERT INTO sandpit_session_pace AS p (token, tat) VALUES ($1, {now} + $2::int8 {us}) \
         ON CONFLICT (token) DO UPDATE SET tat = greatest(p.tat, {now}) + $2::int8 {us} \
           WHERE greatest(p.tat - $3::int8 {us}, {now}) - {now} <= $4::int8 {us} \
         RETURNING (extract(epoch FROM greatest(p.tat - ($2::int8 + $3::int8) {us} - {now}, \
           interval '0')) * 1000000)::int8"
    )
}

/// One failure of a key under a sliding window (`auth::ratelimit`'s, in SQL): the window
/// rolled to `{now}`, the failure counted, and whether the key was already at `$2` failures
/// in the minute before it. `$1` key.
fn auth_sql(now: &str) -> String {
    let age = format!("({now} - f.start)");
    format!(
        "INSERT INTO sandpit_auth_failures AS f (key, start, current, previous) \
           VALUES ($1, {now}, 1, 0) \
         ON CONFLICT (key) DO UPDATE SET \
           start = CASE WHEN {age} >= interval '2 minutes' THEN {now} \
                        WHEN {age} >= interval '1 minute' THEN f.start + interval '1 minute' \
                        ELSE f.start END, \
           previous = CASE WHEN {age} >= interval '2 minutes' THEN 0 \
                           WHEN {age} >= interval '1 minute' THEN f.current ELSE f.previous END, \
           current = CASE WHEN {age} >= interval '1 minute' THEN 1 ELSE f.current + 1 END \
         RETURNING f.previous * greatest(0.0, least(1.0, \
             1.0 - extract(epoch FROM {now} - f.start)::float8 / 60.0)) \
           + (f.current - 1) >= $2::int4"
    )
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl PgStore {
    /// Create the tables if missing (under the registry's schema lock).
    pub async fn limits_schema(&self) -> Result<(), RegistryError> {
        self.create_tables(SCHEMA, "creating the limit tables")
            .await
    }

    /// A new session of `token` under the fleet's pace (see `lifecycle::pace::step`):
    /// `interval` and `tolerance` from `lifecycle::pace::params`, waiting at most `max_wait`.
    /// The wait before it may start (zero: now), or `None` when its turn is further away
    /// than `max_wait` (nothing reserved).
    pub async fn pace_admit(
        &self,
        token: &str,
        interval: Duration,
        tolerance: Duration,
        max_wait: Duration,
    ) -> Result<Option<Duration>, RegistryError> {
        self.pace_admit_at(token, interval, tolerance, max_wait, None)
            .await
    }

    /// [`PgStore::pace_admit`] at the registry's clock, or at `now` (for tests that compare
    /// the statement with the pure step).
    pub async fn pace_admit_at(
        &self,
        token: &str,
        interval: Duration,
        tolerance: Duration,
        max_wait: Duration,
        now: Option<time::OffsetDateTime>,
    ) -> Result<Option<Duration>, RegistryError> {
        let (i, t, w) = (micros(interval), micros(tolerance), micros(max_wait));
        let c = self.client().await?;
        let rows = match now {
            None => {
                let sql = pace_sql("statement_timestamp()");
                c.query(&sql, &[&token, &i, &t, &w]).await
            }
            Some(at) => {
                let sql = pace_sql("$5::timestamptz");
                c.query(&sql, &[&token, &i, &t, &w, &at]).await
            }
        }
        .map_err(|e| db("pacing a session", e))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let wait: i64 = row.try_get(0).map_err(|e| db("pacing a session", e))?;
        Ok(Some(Duration::from_micros(
            u64::try_from(wait).unwrap_or(0),
        )))
    }

    /// Count one authentication failure against `key` fleet-wide; true when the key was
    /// already at `per_minute` failures in the minute before (see `auth::ratelimit`).
    pub async fn auth_failed(&self, key: &str, per_minute: u32) -> Result<bool, RegistryError> {
        self.auth_failed_at(key, per_minute, None).await
    }

    /// [`PgStore::auth_failed`] at the registry's clock, or at `now` (tests).
    pub async fn auth_failed_at(
        &self,
        key: &str,
        per_minute: u32,
        now: Option<time::OffsetDateTime>,
    ) -> Result<bool, RegistryError> {
        let limit = i32::try_from(per_minute).unwrap_or(i32::MAX);
        let c = self.client().await?;
        let row = match now {
            None => {
                let sql = auth_sql("statement_timestamp()");
                c.query_one(&sql, &[&key, &limit]).await
            }
            Some(at) => {
                let sql = auth_sql("$3::timestamptz");
                c.query_one(&sql, &[&key, &limit, &at]).await
            }
        }
        .map_err(|e| db("counting an authentication failure", e))?;
        row.try_get(0)
            .map_err(|e| db("counting an authentication failure", e))
    }

    /// Remove rows that no longer change any answer: pace instants in the past (as good as
    /// none) and failure windows over two minutes old (they count nothing).
    pub async fn limits_forget_stale(&self) -> Result<(), RegistryError> {
        self.client()
            .await?
            .batch_execute(
                "DELETE FROM sandpit_session_pace WHERE tat < now() - interval '1 minute'; \
                 DELETE FROM sandpit_auth_failures WHERE start < now() - interval '2 minutes'",
            )
            .await
            .map_err(|e| db("forgetting stale limit rows", e))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_statements_use_one_clock_expression() {
        let p = super::pace_sql("NOW_X");
        assert!(!p.contains("now()") && !p.contains("clock_timestamp"));
        assert!(p.matches("NOW_X").count() >= 4);
        let a = super::auth_sql("NOW_X");
        assert!(!a.contains("now()") && a.contains("NOW_X"));
    }
}
