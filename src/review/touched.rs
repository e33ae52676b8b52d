//! Which tables of a fork may differ from the golden, on evidence the agent cannot forge, so
//! the review, the patch check and the promote capture read only those. A table keeps its
//! golden contents when, compared with the pristine reference fork of the same golden:
//! - it is the same relation (same OID: a table dropped and re-created under its name is
//!   another one), permanent (an unlogged table is emptied by a crash without a write),
//! - its storage is the same file (`relfilenode`: TRUNCATE, VACUUM FULL, CLUSTER, ALTER …
//!   TYPE, SET TABLESPACE and REFRESH MATERIALIZED VIEW give it a new one; only a superuser
//!   can write `pg_class`),
//! - its columns are the same (an ADD COLUMN with a default changes rows without a write),
//! - Postgres' own counters of inserted, updated and deleted tuples are the same: every
//!   heap write counts there whoever runs it (INSERT, COPY, UPDATE, DELETE, MERGE, triggers,
//!   rules, functions owned by others, rolled-back writes too), kept by the server.
//!
//! Counters are only evidence when nothing can have hidden or lost them, so the whole
//! database is read instead ([`Marks::trust`] says why) unless: every other session of the
//! database has ended (a backend publishes its counters before it leaves
//! `pg_stat_activity`); no prepared transaction is pending (its counters are published only
//! when it ends); the server has not crash-restarted since it started (a crash drops every
//! counter and resets the shared statistics' `stats_reset`, and restarts the checkpointer:
//! both must date from the postmaster's start; a role that cannot see the checkpointer (a
//! provider's own role without `pg_read_all_stats` sees no backend type) relies on the
//! first); counts
//! are on (`track_counts` is superuser-only; no role, database or function setting names
//! it, and no grant lets anyone set it); no `pg_stat_reset*` function may be run by anyone
//! but a superuser. The agent is never a superuser of an `instance`, `template` or `remote`
//! backend; a token whose sessions were superusers (`microvm`'s `superuser` tokens) gets a
//! full read from its callers (`review::store`, `review::verify`, `promote::change`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::conn::{ConnError, Side};

/// The most the checkpointer may start, and the shared statistics may have been reset, after
/// the postmaster started without counting as a restart after a crash: at a normal start the
/// checkpointer is forked in the same pass as the startup process, which restores the
/// statistics (keeping their reset time) or starts them afresh; a crash restarts the one and
/// resets the other.
const CHECKPOINTER_SLACK: &str = "1 second";

/// A backend keeps table counters locally for up to this long after a commit before
/// publishing them when idle (Postgres' PGSTAT_IDLE_INTERVAL is 10 s), plus a margin.
pub(super) const STATS_IDLE_FLUSH: &str = "11 seconds";

/// What one table shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// `schema.name`, quoted as the server quotes.
    pub qname: String,
    /// 'r' or 'm'.
    pub relkind: String,
    /// 'p' or 'u'.
    pub persistence: String,
    /// Storage file number.
    pub relfilenode: String,
    /// Every column (dropped ones too) with its type and whether it has a missing value.
    pub columns: String,
    /// Inserted, updated, deleted tuples; None when unreadable.
    pub counters: Option<[i64; 3]>,
}

/// What one database shows.
#[derive(Debug, Clone, Default)]
pub struct Marks {
    /// By OID.
    pub tables: BTreeMap<u32, Mark>,
    /// Why the counters of this database are no evidence (None: they are).
    pub distrust: Option<String>,
}

impl Marks {
    /// None when the counters may be relied on, else why not.
    pub fn trust(&self) -> Option<&str> {
        self.distrust.as_deref()
    }
}

/// Why the server's counters are no evidence, if they are not. Read inside the caller's
/// transaction, after the caller has waited for the other sessions of the database to end or
/// publish ([`settle`]).
async fn distrust(side: &Side) -> Result<Option<String>, ConnError> {
    let q = format!(
        "SELECT \
         (SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_xacts x \
           WHERE x.database = pg_catalog.current_database()), \
         (SELECT CASE WHEN pg_catalog.count(a.backend_start) = 0 THEN 1 \
           ELSE pg_catalog.count(*) FILTER (WHERE a.backend_start <= \
             pg_catalog.pg_postmaster_start_time() + interval '{CHECKPOINTER_SLACK}') END \
           FROM pg_catalog.pg_stat_activity a WHERE a.backend_type = 'checkpointer') \
         + (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_bgwriter b \
           WHERE b.stats_reset <= pg_catalog.pg_postmaster_start_time() + interval '{CHECKPOINTER_SLACK}'), \
         pg_catalog.current_setting('track_counts'), \
         (SELECT pg_catalog.count(*) FROM pg_catalog.pg_db_role_setting s \
           WHERE pg_catalog.array_to_string(s.setconfig, ',') ~* 'track_counts') \
         + (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p \
           WHERE pg_catalog.array_to_string(p.proconfig, ',') ~* 'track_counts') \
         + (SELECT pg_catalog.count(*) FROM pg_catalog.pg_parameter_acl g \
           WHERE g.parname ~* 'track_counts'), \
         (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc p, \
           pg_catalog.aclexplode(COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner))) g \
           WHERE p.proname ~ '^pg_stat_reset' AND g.privilege_type = 'EXECUTE' \
           AND NOT COALESCE((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = g.grantee), false)), \
         (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity a \
           WHERE a.backend_type = 'client backend' AND a.pid <> pg_catalog.pg_backend_pid() \
           AND a.datname = pg_catalog.current_database())"
    );
    let rows = side.rows(&q).await?;
    let Some(r) = rows.first() else {
        return Ok(Some("the server's state could not be read".into()));
    };
    let n = |i: usize| -> i64 {
        r.get(i)
            .and_then(|v| v.as_deref())
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1)
    };
    let why = if n(0) != 0 {
        "a prepared transaction is pending (its counters are not published yet)"
    } else if n(1) != 2 {
        "the server may have restarted after a crash (which drops every counter)"
    } else if r.get(2).and_then(|v| v.as_deref()) != Some("on") {
        "track_counts is off"
    } else if n(3) != 0 {
        "a role, database, function or grant names track_counts"
    } else if n(4) != 0 {
        "a role other than a superuser may reset statistics"
    } else {
        return Ok(None);
    };
    Ok(Some(why.to_string()))
}

/// Read the marks of every table and materialized view (temporary ones excepted), inside
/// the caller's transaction. What cannot be read makes the marks distrusted (every table is
/// then read), never an error of the caller.
pub async fn read(side: &Side) -> Result<Marks, ConnError> {
    side.exec("SAVEPOINT sandpit_marks").await?;
    match read_inner(side).await {
        Ok(m) => {
            side.exec("RELEASE SAVEPOINT sandpit_marks").await?;
            Ok(m)
        }
        Err(e) => {
            side.exec("ROLLBACK TO SAVEPOINT sandpit_marks").await?;
            Ok(Marks {
                tables: BTreeMap::new(),
                distrust: Some(format!("the evidence could not be read: {e}")),
            })
        }
    }
}

async fn read_inner(side: &Side) -> Result<Marks, ConnError> {
    let distrust = distrust(side).await?;
    let q = "SELECT c.oid, pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname), \
             c.relkind, c.relpersistence, c.relfilenode, \
             pg_catalog.pg_stat_get_tuples_inserted(c.oid), pg_catalog.pg_stat_get_tuples_updated(c.oid), \
             pg_catalog.pg_stat_get_tuples_deleted(c.oid), \
             (SELECT pg_catalog.string_agg(a.attnum || ':' || a.atttypid || ':' || a.atttypmod || ':' \
               || a.attisdropped || ':' || a.atthasmissing || ':' || a.attcollation || ':' \
               || a.attgenerated::pg_catalog.text, ',' ORDER BY a.attnum) \
              FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0) \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'm') AND c.relpersistence <> 't' \
             AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') \
             AND n.nspname !~ '^pg_(toast_)?temp_'";
    let mut tables = BTreeMap::new();
    for r in side.rows(q).await? {
        let text = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
        let num = |i: usize| r.get(i)?.as_deref()?.parse::<i64>().ok();
        let Ok(oid) = text(0).parse::<u32>() else {
            continue;
        };
        let counters = match (num(5), num(6), num(7)) {
            (Some(a), Some(b), Some(c)) => Some([a, b, c]),
            _ => None,
        };
        tables.insert(
            oid,
            Mark {
                qname: text(1),
                relkind: text(2),
                persistence: text(3),
                relfilenode: text(4),
                columns: text(8),
                counters,
            },
        );
    }
    Ok(Marks { tables, distrust })
}

/// Whether the table `oid` of `side` may differ from the golden's, given the reference.
pub fn may_differ(reference: &Marks, side: &Marks, oid: u32) -> bool {
    if side.distrust.is_some() || reference.distrust.is_some() {
        return true;
    }
    let (Some(r), Some(s)) = (reference.tables.get(&oid), side.tables.get(&oid)) else {
        return true;
    };
    s.persistence != "p"
        || r.persistence != "p"
        || s.relkind != r.relkind
        || s.relfilenode != r.relfilenode
        || s.relfilenode.is_empty()
        || s.columns != r.columns
        || s.counters.is_none()
        || s.counters != r.counters
}

/// Names of the tables that hold the golden's rows in both `a` and `b` (two forks of the
/// golden compared with each other): under each name the same relation (OID) on both sides,
/// shown unchanged on both. Any missing evidence skips nothing. Only these may go unread.
pub fn unchanged_in_both(reference: &Marks, a: &Marks, b: &Marks) -> BTreeSet<String> {
    if [reference, a, b].iter().any(|m| m.distrust.is_some()) {
        return BTreeSet::new();
    }
    a.tables
        .iter()
        .filter(|(oid, ma)| {
            b.tables.get(oid).is_some_and(|mb| mb.qname == ma.qname)
                && !may_differ(reference, a, **oid)
                && !may_differ(reference, b, **oid)
        })
        .map(|(_, m)| m.qname.clone())
        .collect()
}

/// Why `side` must be read whole, if it must (the reference's or its own reason).
pub fn why_all<'a>(reference: &'a Marks, side: &'a Marks) -> Option<String> {
    side.trust()
        .map(|w| format!("scratch side: {w}"))
        .or_else(|| reference.trust().map(|w| format!("reference: {w}")))
}

/// Opens the scratch snapshot once no other session can hold unpublished counters: every
/// other client session has ended or been idle longer than the stats flush interval.
/// Returns whether that happened within `timeout` (the transaction is open either way).
pub(super) async fn settle(side: &Side, timeout: Duration) -> Result<bool, ConnError> {
    let deadline = Instant::now() + timeout;
    // Checked after the snapshot is taken, so anything the snapshot sees was committed by a
    // session this check covers.
    let q = format!(
        "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity a \
         WHERE a.backend_type = 'client backend' AND a.pid <> pg_catalog.pg_backend_pid() \
         AND a.datname = pg_catalog.current_database() \
         AND (a.state IS DISTINCT FROM 'idle' \
              OR a.state_change > pg_catalog.clock_timestamp() - interval '{STATS_IDLE_FLUSH}')"
    );
    loop {
        side.begin().await?;
        let busy = side
            .rows(&q)
            .await?
            .first()
            .and_then(|r| r[0].as_deref())
            .and_then(|s| s.parse::<i64>().ok())
            .unwrap_or(1);
        // An exiting backend publishes its counters (a before_shmem_exit hook) before it
        // leaves pg_stat_activity (an on_shmem_exit hook), so "gone" means "published".
        if busy == 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        side.rollback().await?;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(node: &str, counters: [i64; 3]) -> Mark {
        Mark {
            qname: "public.t".into(),
            relkind: "r".into(),
            persistence: "p".into(),
            relfilenode: node.into(),
            columns: "1:23:-1:false:false:0:".into(),
            counters: Some(counters),
        }
    }

    fn marks(m: Mark) -> Marks {
        Marks {
            tables: BTreeMap::from([(1, m)]),
            distrust: None,
        }
    }

    #[test]
    fn only_identical_evidence_skips_a_table() {
        let r = marks(mark("100", [5, 0, 0]));
        assert!(!may_differ(&r, &marks(mark("100", [5, 0, 0])), 1));
        // Each piece of evidence on its own makes it read.
        assert!(may_differ(&r, &marks(mark("101", [5, 0, 0])), 1));
        assert!(may_differ(&r, &marks(mark("100", [6, 0, 0])), 1));
        assert!(may_differ(&r, &marks(mark("100", [5, 1, 0])), 1));
        assert!(may_differ(&r, &marks(mark("100", [5, 0, 1])), 1));
        let mut cols = mark("100", [5, 0, 0]);
        cols.columns.push_str(",2:25:-1:false:true:100:");
        assert!(may_differ(&r, &marks(cols), 1));
        let mut unlogged = mark("100", [5, 0, 0]);
        unlogged.persistence = "u".into();
        assert!(may_differ(&r, &marks(unlogged), 1));
        let mut unread = mark("100", [5, 0, 0]);
        unread.counters = None;
        assert!(may_differ(&r, &marks(unread), 1));
        // A table the reference does not have (re-created under the same name).
        let other = Marks {
            tables: BTreeMap::from([(2, mark("100", [5, 0, 0]))]),
            distrust: None,
        };
        assert!(may_differ(&r, &other, 2));
    }

    #[test]
    fn only_the_same_unchanged_relation_under_one_name_goes_unread() {
        let r = Marks {
            tables: BTreeMap::from([(1, mark("100", [5, 0, 0])), (2, mark("200", [5, 0, 0]))]),
            distrust: None,
        };
        let mut both = r.clone();
        both.tables.get_mut(&2).expect("2").qname = "public.u".into();
        let skip = unchanged_in_both(&r, &both, &both);
        assert_eq!(skip.len(), 2, "{skip:?}");
        // Two unchanged tables whose names were swapped on one side: each name holds
        // another relation on each side, so neither is skipped.
        let mut swapped = both.clone();
        swapped.tables.get_mut(&1).expect("1").qname = "public.u".into();
        swapped.tables.get_mut(&2).expect("2").qname = "public.t".into();
        assert!(unchanged_in_both(&r, &both, &swapped).is_empty());
        // Written on one side only: read on both.
        let mut written = both.clone();
        written.tables.get_mut(&1).expect("1").counters = Some([6, 0, 0]);
        let skip = unchanged_in_both(&r, &both, &written);
        assert_eq!(skip, BTreeSet::from(["public.u".to_string()]));
    }

    #[test]
    fn distrusted_counters_read_everything() {
        let r = marks(mark("100", [5, 0, 0]));
        let mut s = marks(mark("100", [5, 0, 0]));
        s.distrust = Some("track_counts is off".into());
        assert!(may_differ(&r, &s, 1));
        assert!(unchanged_in_both(&r, &s, &r).is_empty());
        assert!(unchanged_in_both(&r, &r, &s).is_empty());
        assert!(
            unchanged_in_both(&s, &r, &r).is_empty(),
            "a distrusted reference too"
        );
        assert!(why_all(&r, &s).is_some_and(|w| w.contains("track_counts")));
    }
}
