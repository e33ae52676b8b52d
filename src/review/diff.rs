//! The review diff: a scratch database against the pristine reference fork of the golden.
//! Only tables that may differ from the golden are scanned (on the evidence
//! [`super::touched`] describes), so the cost follows what the agent touched.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::catalog::{self, Catalog};

pub mod data_order;
use super::conn::{literal, ConnError, Side, Timeouts, SESSION_SETTINGS};
use super::data::{self, Limits, TablePatch};
use super::model::{Review, ScanInfo, TableDiff};
use super::schema::{self, relations};
use super::sql::{order, Stmts};
use super::touched;
use super::unmodeled;
use crate::pgconn::BackendTarget;
use crate::provider::golden::{AGENT, AGENT_READ, AGENT_WRITE, REVIEWER};
use data_order::Step;

/// Knobs of one diff.
#[derive(Debug, Clone, Copy)]
pub struct DiffOptions {
    /// statement_timeout of review queries.
    pub statement_timeout: Duration,
    /// lock_timeout of review queries.
    pub lock_timeout: Duration,
    /// How long to wait for the agent's sessions to publish their counters before falling
    /// back to scanning every table.
    pub settle_timeout: Duration,
    /// Samples per table per change kind.
    pub samples: usize,
    /// Compare every table, not only those the counters show as touched.
    pub full_scan: bool,
    /// End the agent's sessions in the scratch database first (the token has ended): a
    /// query still running there would otherwise hold back its counters.
    pub end_sessions: bool,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            statement_timeout: Duration::from_secs(60),
            lock_timeout: Duration::from_secs(5),
            settle_timeout: Duration::from_secs(3),
            samples: 20,
            full_scan: false,
            end_sessions: false,
        }
    }
}

/// Take the diff. `token`/`task` only label the patch.
pub async fn diff(
    reference: &BackendTarget,
    scratch: &BackendTarget,
    opts: DiffOptions,
    token: &str,
    task: &str,
) -> Result<Review, ConnError> {
    let started = Instant::now();
    let t = Timeouts {
        statement: opts.statement_timeout,
        lock: opts.lock_timeout,
    };
    let mut new = Side::connect("scratch", scratch, t).await?;
    let mut old = Side::connect("reference", reference, t).await?;
    if opts.end_sessions {
        new.exec(&format!(
            "SELECT pg_catalog.pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a \
             WHERE a.backend_type = 'client backend' AND a.pid <> pg_catalog.pg_backend_pid() \
             AND {}",
            agent_sessions(scratch)
        ))
        .await?;
    }
    let settled = touched::settle(&new, opts.settle_timeout).await?;
    old.begin().await?;
    let new_cat = catalog::snapshot(&new).await?;
    let old_cat = catalog::snapshot(&old).await?;
    let mut sd = schema::diff(&old_cat, &new_cat);
    let unmodeled = unmodeled::changes(&old, &new).await?;
    if !unmodeled.is_empty() {
        sd.notes.push(format!(
            "{} catalog change(s) of kinds the patch does not carry (each listed with its \
             definition: policies, rules, default privileges, casts, table options and the \
             like): the patch check says differs and promotion refuses them",
            unmodeled.len()
        ));
        sd.changes.extend(unmodeled);
    }
    let new_marks = touched::read(&new).await?;
    let old_marks = touched::read(&old).await?;

    let mut scan = ScanInfo {
        mode: "touched".into(),
        tables_total: new_cat.tables.len(),
        ..Default::default()
    };
    if opts.full_scan {
        scan.mode = "all".into();
        scan.reason = Some("a full scan was asked for".into());
    } else if !settled {
        scan.mode = "all".into();
        scan.reason = Some(format!(
            "a session of the token was active in the last {}, so table counters may lag",
            touched::STATS_IDLE_FLUSH
        ));
    } else if let Some(why) = touched::why_all(&old_marks, &new_marks) {
        scan.mode = "all".into();
        scan.reason = Some(format!("table counters are no evidence: {why}"));
    } else if stats_reset(&old_cat, &new_cat) {
        scan.mode = "all".into();
        scan.reason = Some("table counters went backwards (statistics were reset)".into());
    }
    let lim = Limits {
        samples: opts.samples,
    };
    let mut tables: Vec<TableDiff> = Vec::new();
    let mut patches: BTreeMap<u32, TablePatch> = BTreeMap::new();
    for (oid, t) in &new_cat.tables {
        if t.relkind != "r" {
            continue; // partitioned parents hold no rows; their partitions are scanned
        }
        // Adding a column with a default changes neither counters nor storage, yet its
        // values are the agent's.
        let scan_it = match old_cat.tables.get(oid) {
            None => true,
            Some(o) => {
                scan.mode == "all"
                    || o.counters != t.counters
                    || o.relfilenode != t.relfilenode
                    || t.columns.iter().any(|c| o.column(c.attnum).is_none())
                    || touched::may_differ(&old_marks, &new_marks, *oid)
            }
        };
        if !scan_it {
            continue;
        }
        scan.tables_scanned += 1;
        new.exec("SAVEPOINT sandpit_table").await?;
        old.exec("SAVEPOINT sandpit_table").await?;
        let res = if old_cat.tables.contains_key(oid) {
            data::compare(&mut old, &mut new, &old_cat, &new_cat, *oid, lim).await
        } else {
            data::new_table(&mut new, t, lim)
                .await
                .map(|(mut d, p, n)| {
                    d.key = data::key_names(&new_cat, *oid);
                    (d, p, n)
                })
        };
        match res {
            Ok((d, p, read)) => {
                new.exec("RELEASE SAVEPOINT sandpit_table").await?;
                old.exec("RELEASE SAVEPOINT sandpit_table").await?;
                scan.rows_read += read;
                if d.has_changes() {
                    tables.push(d);
                    patches.insert(*oid, p);
                }
            }
            Err(e) => {
                new.exec("ROLLBACK TO SAVEPOINT sandpit_table").await?;
                old.exec("ROLLBACK TO SAVEPOINT sandpit_table").await?;
                tracing::warn!(table = %t.qname(), error = %e, "review could not compare a table");
                tables.push(TableDiff {
                    table: t.qname(),
                    error: Some(e.to_string()),
                    ..Default::default()
                });
            }
        }
    }
    // Tables the agent dropped: their rows count as deleted.
    for (oid, t) in &old_cat.tables {
        if t.relkind != "r" || new_cat.tables.contains_key(oid) {
            continue;
        }
        scan.tables_scanned += 1;
        old.exec("SAVEPOINT sandpit_table").await?;
        match data::dropped_table(&mut old, t, lim).await {
            Ok((mut d, _, read)) => {
                old.exec("RELEASE SAVEPOINT sandpit_table").await?;
                scan.rows_read += read;
                d.key = data::key_names(&old_cat, *oid);
                if d.has_changes() {
                    tables.push(d);
                }
            }
            Err(e) => {
                old.exec("ROLLBACK TO SAVEPOINT sandpit_table").await?;
                tables.push(TableDiff {
                    table: t.qname(),
                    error: Some(e.to_string()),
                    ..Default::default()
                });
            }
        }
    }
    let _ = new.rollback().await;
    let _ = old.rollback().await;
    for t in &mut tables {
        t.mark_cut_samples();
    }

    let mut notes = sd.notes.clone();
    if tables.iter().any(|t| t.error.is_some()) {
        notes.push("some tables could not be compared; the patch does not cover them".into());
    }
    let mut order = data_order(&old_cat, &new_cat, &patches);
    quiet_triggers(&old_cat, &new_cat, &patches, &mut order);
    notes.extend(order.notes.iter().cloned());
    let patch = render_patch(&sd.stmts, &patches, &order, token, task);
    Ok(Review {
        token: token.to_string(),
        task: task.to_string(),
        generated_at: crate::rfc3339::now(),
        duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        scan,
        schema: sd.changes,
        sequences: sd.sequences,
        data: tables,
        statements: Default::default(),
        notes,
        patch,
        verification: None,
    })
}

/// Which sessions of `pg_stat_activity a` are the agent's: those of the agent roles when
/// the review logs in as its own role (which may signal them), else those of the role the
/// review shares with the agent (the one thing a non-superuser may signal).
fn agent_sessions(scratch: &BackendTarget) -> String {
    if scratch.user == REVIEWER {
        let roles: Vec<String> = [AGENT, AGENT_WRITE, AGENT_READ]
            .iter()
            .map(|r| literal(r))
            .collect();
        format!("a.usename IN ({})", roles.join(", "))
    } else {
        "a.usename = CURRENT_USER".to_string()
    }
}

/// Counters only grow; lower counters in the scratch database mean they were reset.
fn stats_reset(old: &Catalog, new: &Catalog) -> bool {
    new.tables.iter().any(|(oid, t)| {
        old.tables
            .get(oid)
            .map(|o| (0..3).any(|i| t.counters[i] < o.counters[i]))
            .unwrap_or(false)
    })
}

/// The order of the row changes in the patch (see [`data_order`]).
fn data_order(
    old: &Catalog,
    new: &Catalog,
    tables: &BTreeMap<u32, TablePatch>,
) -> data_order::DataOrder {
    let present: BTreeMap<u32, Vec<Step>> = tables
        .iter()
        .map(|(oid, p)| {
            let steps = [
                (Step::Delete, &p.deletes),
                (Step::Update, &p.updates),
                (Step::Insert, &p.inserts),
            ]
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(s, _)| *s)
            .collect();
            (*oid, steps)
        })
        .collect();
    data_order::order(old, new, &present)
}

/// ALTER TABLE … ADD COLUMN fires no trigger, but the patch's UPDATEs that fill the column
/// would: the golden's triggers of such tables are off while the rows change (the patch owns
/// those tables anyway, as it alters them).
fn quiet_triggers(
    old: &Catalog,
    new: &Catalog,
    tables: &BTreeMap<u32, TablePatch>,
    order: &mut data_order::DataOrder,
) {
    for oid in tables.keys() {
        let (Some(o), Some(t)) = (old.tables.get(oid), new.tables.get(oid)) else {
            continue;
        };
        if t.columns.iter().all(|c| o.column(c.attnum).is_some()) {
            continue;
        }
        // Triggers in force while the rows change: the golden's, unchanged (a changed one
        // is dropped before and created after).
        for (toid, g) in new.triggers.iter().filter(|(_, g)| g.table == *oid) {
            let kept = old
                .triggers
                .get(toid)
                .map(|og| relations::trigger_shape(og, old) == relations::trigger_shape(g, new));
            if kept != Some(true) {
                continue;
            }
            let tn = t.qname();
            order
                .before
                .push(format!("ALTER TABLE {tn} DISABLE TRIGGER {};", g.name));
            order
                .after
                .push(format!("ALTER TABLE {tn} ENABLE TRIGGER {};", g.name));
            order.notes.push(format!(
                "trigger {} of {tn} is disabled while the patch's rows change: the agent added \
                 columns to {tn}, which fired no trigger, and the patch fills them by UPDATE",
                g.name
            ));
        }
    }
}

fn render_patch(
    stmts: &Stmts,
    tables: &BTreeMap<u32, TablePatch>,
    order: &data_order::DataOrder,
    token: &str,
    task: &str,
) -> String {
    let mut stmts = stmts.clone();
    stmts.sort_by_key(|(o, _)| *o);
    let mut out = format!(
        "-- sandpit review patch: token {token}, task {task}, generated {}.\n\
         -- Applied to a fresh fork of the golden it reproduces the scratch database for what the\n\
         -- diff covers. sandpit never applies it. Triggers of the golden fire while it runs.\n\
         -- Its values were written by the agent: apply it as a low-privilege role that owns\n\
         -- only what it changes, never as a superuser.\n\
         -- Strings are quoted for standard_conforming_strings = on, so it is pinned first.\n\
         SET standard_conforming_strings = on;\n\
         BEGIN;\n",
        crate::rfc3339::now()
    );
    // Not search_path: every name in the patch is qualified, and the golden's own functions
    // and triggers, which may run while it applies, expect the database's usual path.
    for (k, v) in SESSION_SETTINGS.iter().filter(|(k, _)| *k != "search_path") {
        out.push_str(&format!("SET LOCAL {k} = {v};\n"));
    }
    out.push_str("SET LOCAL check_function_bodies = off;\nSET CONSTRAINTS ALL DEFERRED;\n");
    let before: Vec<&String> = stmts
        .iter()
        .filter(|(o, _)| *o < order::DATA)
        .map(|(_, s)| s)
        .collect();
    let after: Vec<&String> = stmts
        .iter()
        .filter(|(o, _)| *o > order::DATA)
        .map(|(_, s)| s)
        .collect();
    if !before.is_empty() {
        out.push_str("\n-- schema changes\n");
        for s in before {
            out.push_str(s);
            out.push('\n');
        }
    }
    if !order.before.is_empty() {
        out.push_str("\n-- before the row changes (see the review's notes)\n");
        for st in &order.before {
            out.push_str(st);
            out.push('\n');
        }
    }
    for (oid, step) in &order.steps {
        let Some(p) = tables.get(oid) else { continue };
        let (title, list) = match step {
            Step::Delete => ("deleted", &p.deletes),
            Step::Update => ("updated", &p.updates),
            Step::Insert => ("inserted", &p.inserts),
        };
        if list.is_empty() {
            continue;
        }
        out.push_str(&format!("\n-- {title} rows\n"));
        for st in list {
            out.push_str(st);
            out.push('\n');
        }
    }
    if !order.steps.is_empty() {
        // Deferred checks run here, when every row is in place: a table with pending checks
        // could not be altered by what follows.
        out.push_str("\nSET CONSTRAINTS ALL IMMEDIATE;\n");
    }
    if !order.after.is_empty() {
        for st in &order.after {
            out.push_str(st);
            out.push('\n');
        }
    }
    if !after.is_empty() {
        out.push_str("\n-- constraints, indexes, views, triggers, sequence positions\n");
        for s in after {
            out.push_str(s);
            out.push('\n');
        }
    }
    out.push_str("\nCOMMIT;\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_pins_standard_conforming_strings_before_any_value() {
        let mut t = TablePatch::default();
        t.inserts
            .push("INSERT INTO public.t VALUES ('it''s \\'' || x');".to_string());
        let tables = BTreeMap::from([(1u32, t)]);
        let order = data_order(&Catalog::default(), &Catalog::default(), &tables);
        let patch = render_patch(&Vec::new(), &tables, &order, "tok", "task");
        let first_sql = patch
            .lines()
            .find(|l| !l.starts_with("--"))
            .expect("a statement");
        assert_eq!(first_sql, "SET standard_conforming_strings = on;");
        assert!(patch.contains("low-privilege role"), "{patch}");
        let set = patch.find("SET standard_conforming_strings").expect("set");
        let begin = patch.find("BEGIN;").expect("begin");
        let insert = patch.find("INSERT").expect("insert");
        assert!(set < begin && begin < insert, "{patch}");
    }
}
