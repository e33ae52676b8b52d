//! The workers' room in the shared registry (`sandpit_workers`): one row per worker URL with
//! its last capacity report and when it came, recorded by the fronts that ask the workers on
//! their behalf; the forks fronts place are counted in it at once (a conditional update, so
//! two fronts never both take a worker's last room). Ages are measured on the server's clock,
//! so fronts' clocks do not matter.

use std::sync::Arc;
use std::time::Duration;

use super::postgres::{db, PgStore};
use super::RegistryError;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandpit_workers (
    url text PRIMARY KEY,
    reports bool,
    max_sandboxes int8,
    sandboxes int8,
    warm int8,
    draining bool,
    reported_at timestamptz,
    asked_at timestamptz,
    unreachable_since timestamptz,
    lost_at timestamptz);
";

/// A worker's room as it reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerRoom {
    /// `worker.max_sandboxes`.
    pub max_sandboxes: u64,
    /// Sandboxes held (plus forks placed since the report).
    pub sandboxes: u64,
    /// Ready warm-pool members.
    pub warm: u64,
    /// Takes no new sandbox.
    pub draining: bool,
}

/// What a capacity question got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerAnswer {
    /// A report.
    Room(WorkerRoom),
    /// An answer without a report (the service does not report capacity).
    NoReport,
    /// No answer.
    Silent,
}

/// One row as read.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRow {
    /// The worker's URL (its `remote.urls` entry).
    pub url: String,
    /// None: never answered; Some(None): answered without a report.
    pub room: Option<Option<WorkerRoom>>,
    /// Since its last answer.
    pub age: Option<Duration>,
    /// Since its first unanswered question after that answer.
    pub unreachable_for: Option<Duration>,
    /// Declared lost by a front.
    pub lost: bool,
}

/// The book over the shared registry's connection pool.
pub struct WorkerBook {
    store: Arc<PgStore>,
}

fn to_db(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_db(v: Option<i64>) -> u64 {
    v.map_or(0, |v| u64::try_from(v).unwrap_or(0))
}

fn secs(v: Option<f64>) -> Option<Duration> {
    v.map(|s| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX))
}

impl WorkerBook {
    /// Creates the table if needed (under the schema lock every replica takes).
    pub async fn open(store: Arc<PgStore>) -> Result<WorkerBook, RegistryError> {
        store
            .create_tables(SCHEMA, "creating the workers table")
            .await?;
        Ok(WorkerBook { store })
    }

    /// Rows for these URLs exist.
    pub async fn enlist(&self, urls: &[String]) -> Result<(), RegistryError> {
        self.store
            .client()
            .await?
            .execute(
                "INSERT INTO sandpit_workers (url) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
                &[&urls],
            )
            .await
            .map_err(|e| db("enlisting workers", e))?;
        Ok(())
    }

    /// Marks as asked, and returns, the workers not asked within `fresh` (`failed` for one
    /// whose last question went unanswered). Concurrent callers each get different rows.
    pub async fn claim_due(
        &self,
        urls: &[String],
        fresh: Duration,
        failed: Duration,
    ) -> Result<Vec<String>, RegistryError> {
        let rows = self
            .store
            .client()
            .await?
            .query(
                "UPDATE sandpit_workers SET asked_at = now() \
                 WHERE url = ANY($1) AND (asked_at IS NULL OR asked_at < now() - make_interval(secs => \
                   CASE WHEN unreachable_since IS NULL THEN $2::float8 ELSE $3::float8 END)) \
                 RETURNING url",
                &[&urls, &fresh.as_secs_f64(), &failed.as_secs_f64()],
            )
            .await
            .map_err(|e| db("claiming workers to ask", e))?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Records answers: a report (or an answer without one) replaces the row's room and
    /// clears its unreachable and lost marks; silence starts the unreachable time.
    pub async fn record(&self, answers: &[(String, WorkerAnswer)]) -> Result<(), RegistryError> {
        let mut urls = Vec::new();
        let mut reports = Vec::new();
        let (mut max, mut held, mut warm, mut draining) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut silent = Vec::new();
        for (url, a) in answers {
            let room = match a {
                WorkerAnswer::Silent => {
                    silent.push(url.clone());
                    continue;
                }
                WorkerAnswer::NoReport => None,
                WorkerAnswer::Room(r) => Some(*r),
            };
            urls.push(url.clone());
            reports.push(room.is_some());
            max.push(room.map(|r| to_db(r.max_sandboxes)));
            held.push(room.map(|r| to_db(r.sandboxes)));
            warm.push(room.map(|r| to_db(r.warm)));
            draining.push(room.map(|r| r.draining));
        }
        let c = self.store.client().await?;
        if !urls.is_empty() {
            c.execute(
                "UPDATE sandpit_workers w SET reports = a.reports, max_sandboxes = a.max, \
                   sandboxes = a.held, warm = a.warm, draining = a.draining, reported_at = now(), \
                   unreachable_since = NULL, lost_at = NULL \
                 FROM unnest($1::text[], $2::bool[], $3::int8[], $4::int8[], $5::int8[], $6::bool[]) \
                   AS a(url, reports, max, held, warm, draining) \
                 WHERE w.url = a.url",
                &[&urls, &reports, &max, &held, &warm, &draining],
            )
            .await
            .map_err(|e| db("recording workers' capacity", e))?;
        }
        if !silent.is_empty() {
            c.execute(
                "UPDATE sandpit_workers SET unreachable_since = coalesce(unreachable_since, now()) \
                 WHERE url = ANY($1)",
                &[&silent],
            )
            .await
            .map_err(|e| db("recording silent workers", e))?;
        }
        Ok(())
    }

    /// The rows of these URLs.
    pub async fn read(&self, urls: &[String]) -> Result<Vec<WorkerRow>, RegistryError> {
        let rows = self
            .store
            .client()
            .await?
            .query(
                "SELECT url, reports, max_sandboxes, sandboxes, warm, draining, \
                   extract(epoch from now() - reported_at)::float8, \
                   extract(epoch from now() - unreachable_since)::float8, lost_at IS NOT NULL \
                 FROM sandpit_workers WHERE url = ANY($1)",
                &[&urls],
            )
            .await
            .map_err(|e| db("reading workers' capacity", e))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let reports: Option<bool> = r.get(1);
                let room = reports.map(|yes| {
                    yes.then(|| WorkerRoom {
                        max_sandboxes: from_db(r.get(2)),
                        sandboxes: from_db(r.get(3)),
                        warm: from_db(r.get(4)),
                        draining: r.get::<_, Option<bool>>(5).unwrap_or(true),
                    })
                });
                WorkerRow {
                    url: r.get(0),
                    room,
                    age: secs(r.get(6)),
                    unreachable_for: secs(r.get(7)),
                    lost: r.get(8),
                }
            })
            .collect())
    }

    /// Counts one fork placed on `url` if its report (younger than `fresh_within`) leaves
    /// room; false when it does not.
    pub async fn reserve(&self, url: &str, fresh_within: Duration) -> Result<bool, RegistryError> {
        let n = self
            .store
            .client()
            .await?
            .execute(
                "UPDATE sandpit_workers SET sandboxes = sandboxes + 1, warm = greatest(warm - 1, 0) \
                 WHERE url = $1 AND reports AND NOT draining AND sandboxes < max_sandboxes \
                   AND unreachable_since IS NULL AND lost_at IS NULL \
                   AND reported_at > now() - make_interval(secs => $2::float8)",
                &[&url, &fresh_within.as_secs_f64()],
            )
            .await
            .map_err(|e| db("counting a placed fork", e))?;
        Ok(n == 1)
    }

    /// Marks a worker lost; true for the one caller that marked it.
    pub async fn mark_lost(&self, url: &str) -> Result<bool, RegistryError> {
        let n = self
            .store
            .client()
            .await?
            .execute(
                "UPDATE sandpit_workers SET lost_at = now() WHERE url = $1 AND lost_at IS NULL",
                &[&url],
            )
            .await
            .map_err(|e| db("marking a worker lost", e))?;
        Ok(n == 1)
    }
}
