//! Row diff of one table: both sides read through cursors in the same key order and merged
//! in Rust, so memory stays bounded (samples are capped, counts are exact). Ordering never
//! relies on agent-defined operators: integer columns sort natively (built-in btree
//! opclasses, which a non-superuser cannot replace), everything else by its text output in
//! the "C" collation, compared byte-wise in Rust.

use std::cmp::Ordering;

use super::catalog::{Catalog, Column, Table};
use super::conn::{ConnError, Side, TextRow};
use super::model::{TableDiff, UpdatedRow};

mod statements;
use statements::{delete_sql, update_sql, Inserts};

/// Rows fetched per round trip.
const BATCH: u32 = 2000;
/// Rows per multi-row INSERT in the patch.
const INSERT_BATCH: usize = 100;

/// How one ordering column compares.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    /// int2/int4/int8 on both sides: native order, compared as i64.
    Int,
    /// Text output, "C" collation, NULLs last.
    Text,
}

/// The patch statements of one table.
#[derive(Debug, Default)]
pub struct TablePatch {
    /// DELETE statements.
    pub deletes: Vec<String>,
    /// UPDATE statements.
    pub updates: Vec<String>,
    /// INSERT statements.
    pub inserts: Vec<String>,
}

/// Limits of one table diff.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Samples kept per change kind.
    pub samples: usize,
}

fn is_int(type_oid: u32) -> bool {
    matches!(type_oid, 20 | 21 | 23)
}

fn order_expr(col: &str, cmp: Cmp) -> String {
    match cmp {
        Cmp::Int => col.to_string(),
        Cmp::Text => format!(
            "pg_catalog.num_nulls({col}), pg_catalog.format('%s', {col}) COLLATE pg_catalog.\"C\""
        ),
    }
}

fn cmp_value(a: &Option<String>, b: &Option<String>, cmp: Cmp) -> Ordering {
    match cmp {
        Cmp::Int => {
            // NULLS LAST, as an ascending native ORDER BY.
            let p = |v: &Option<String>| v.as_deref().map(|s| s.parse::<i64>().unwrap_or(i64::MAX));
            match (p(a), p(b)) {
                (Some(x), Some(y)) => x.cmp(&y),
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
            }
        }
        Cmp::Text => {
            let k =
                |v: &Option<String>| (v.is_none(), v.as_deref().unwrap_or("").as_bytes().to_vec());
            k(a).cmp(&k(b))
        }
    }
}

/// The unique keys usable for matching rows: primary key first, then unique indexes without
/// predicate or expressions whose columns are all NOT NULL, fewest columns first.
fn keys(cat: &Catalog, table: u32) -> Vec<(String, Vec<i32>)> {
    let Some(t) = cat.tables.get(&table) else {
        return Vec::new();
    };
    let mut out: Vec<(u8, usize, String, Vec<i32>)> = Vec::new();
    for i in cat.indexes.values().filter(|i| i.table == table) {
        let Some((kind, cols)) = i.extra.split_once(':') else {
            continue;
        };
        let cols: Vec<i32> = cols
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .collect();
        let usable = !cols.is_empty()
            && cols
                .iter()
                .all(|&n| n > 0 && t.column(n).map(|c| c.not_null).unwrap_or(false));
        match kind {
            "p" if usable => out.push((0, cols.len(), "primary key".into(), cols)),
            "u" if usable => out.push((1, cols.len(), format!("unique index {}", i.name), cols)),
            _ => {}
        }
    }
    out.sort();
    out.into_iter().map(|(_, _, n, c)| (n, c)).collect()
}

/// How the two versions of a table line up.
struct Plan<'a> {
    old: &'a Table,
    new: &'a Table,
    /// attnums present on both sides, in scratch order.
    common: Vec<i32>,
    /// attnums only in scratch.
    added: Vec<i32>,
    /// `common` then `added`: the columns of a row as read.
    all: Vec<i32>,
    /// Positions (into `all`) of the ordering columns and how they compare.
    order: Vec<(usize, Cmp)>,
    matched_by: String,
    keyed: bool,
}

impl Plan<'_> {
    fn col_new(&self, attnum: i32) -> &Column {
        // attnums in the plan come from `new`.
        self.new.column(attnum).unwrap_or(&self.new.columns[0])
    }

    fn col_old(&self, attnum: i32) -> &Column {
        self.old.column(attnum).unwrap_or(&self.old.columns[0])
    }

    fn cmp_rows(&self, a: &TextRow, b: &TextRow) -> Ordering {
        for &(i, c) in &self.order {
            let o = cmp_value(&a[i], &b[i], c);
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }
}

/// Names of the key columns rows of a table are matched by (primary key first), if any.
pub fn key_names(cat: &Catalog, table: u32) -> Vec<String> {
    let Some(t) = cat.tables.get(&table) else {
        return Vec::new();
    };
    keys(cat, table)
        .into_iter()
        .next()
        .map(|(_, cols)| {
            cols.iter()
                .filter_map(|n| t.column(*n).map(|c| c.name.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Rows of a table the agent dropped: all deleted (counted, samples from the golden). The
/// patch's DROP TABLE removes them.
pub async fn dropped_table(
    reference: &mut Side,
    t: &Table,
    lim: Limits,
) -> Result<(TableDiff, TablePatch, u64), ConnError> {
    let cols: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
    let mut diff = TableDiff {
        table: t.qname(),
        matched_by: "dropped table".into(),
        columns: cols.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let count = reference
        .rows(&format!(
            "SELECT pg_catalog.count(*) FROM ONLY {}",
            t.qname()
        ))
        .await?;
    diff.deleted = count
        .first()
        .and_then(|r| r[0].as_deref())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if !cols.is_empty() && diff.deleted > 0 {
        let sample = format!(
            "SELECT {} FROM ONLY {} LIMIT {}",
            cols.join(", "),
            t.qname(),
            lim.samples
        );
        diff.samples.deleted = reference.rows(&sample).await?;
    }
    let read = diff.samples.deleted.len() as u64;
    Ok((diff, TablePatch::default(), read))
}

/// Rows of a table that exists only in the scratch database: all inserted.
pub async fn new_table(
    scratch: &mut Side,
    t: &Table,
    lim: Limits,
) -> Result<(TableDiff, TablePatch, u64), ConnError> {
    let cols: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
    let mut diff = TableDiff {
        table: t.qname(),
        matched_by: "new table".into(),
        columns: cols.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let mut patch = TablePatch::default();
    if t.columns.is_empty() {
        return Ok((diff, patch, 0));
    }
    let mut ins = Inserts::new(t, &t.columns.iter().map(|c| c.attnum).collect::<Vec<_>>());
    let mut cur = scratch
        .cursor(
            &format!("SELECT {} FROM ONLY {}", cols.join(", "), t.qname()),
            BATCH,
        )
        .await?;
    let mut read = 0;
    while let Some(row) = cur.next().await? {
        read += 1;
        diff.inserted += 1;
        ins.push(&row, &mut patch.inserts);
        if diff.samples.inserted.len() < lim.samples {
            diff.samples.inserted.push(row);
        }
    }
    cur.close().await?;
    ins.flush(&mut patch.inserts);
    Ok((diff, patch, read))
}

/// Compare one table present on both sides (same OID).
pub async fn compare(
    reference: &mut Side,
    scratch: &mut Side,
    ref_cat: &Catalog,
    new_cat: &Catalog,
    oid: u32,
    lim: Limits,
) -> Result<(TableDiff, TablePatch, u64), ConnError> {
    let (old, new) = match (ref_cat.tables.get(&oid), new_cat.tables.get(&oid)) {
        (Some(o), Some(n)) => (o, n),
        _ => {
            return Err(ConnError::Other(format!(
                "table {oid} is not on both sides"
            )))
        }
    };
    let common: Vec<i32> = new
        .columns
        .iter()
        .map(|c| c.attnum)
        .filter(|n| old.column(*n).is_some())
        .collect();
    let added: Vec<i32> = new
        .columns
        .iter()
        .map(|c| c.attnum)
        .filter(|n| old.column(*n).is_none())
        .collect();
    let all: Vec<i32> = common.iter().chain(added.iter()).copied().collect();
    let ref_keys = keys(ref_cat, oid);
    let key = keys(new_cat, oid)
        .into_iter()
        .find(|(_, cols)| ref_keys.iter().any(|(_, c)| c == cols));
    // Without a key, whole rows are compared, values of added columns included (NULL in
    // the golden), except stored generated ones, which follow from the others.
    let (matched_by, key_cols, keyed) = match key {
        Some((name, cols)) => (name, cols, true),
        None => (
            "none (compared as multisets)".to_string(),
            all.iter()
                .copied()
                .filter(|n| {
                    common.contains(n) || new.column(*n).map(|c| c.generated != "s") == Some(true)
                })
                .collect(),
            false,
        ),
    };
    let mut plan = Plan {
        old,
        new,
        common: common.clone(),
        added,
        all: all.clone(),
        order: Vec::new(),
        matched_by,
        keyed,
    };
    for n in &key_cols {
        let Some(pos) = all.iter().position(|c| c == n) else {
            continue;
        };
        let old_int = plan
            .old
            .column(*n)
            .map(|c| is_int(c.type_oid))
            .unwrap_or(true);
        let cmp = if old_int && is_int(plan.col_new(*n).type_oid) {
            Cmp::Int
        } else {
            Cmp::Text
        };
        plan.order.push((pos, cmp));
    }
    let mut diff = TableDiff {
        table: new.qname(),
        matched_by: plan.matched_by.clone(),
        key: if keyed {
            key_cols
                .iter()
                .map(|n| plan.col_new(*n).name.clone())
                .collect()
        } else {
            Vec::new()
        },
        columns: common
            .iter()
            .chain(plan.added.iter())
            .map(|n| plan.col_new(*n).name.clone())
            .collect(),
        ..Default::default()
    };
    if !plan.added.is_empty() {
        diff.note = Some(if keyed {
            "values of columns added by the agent are compared with NULL: the patch adds those \
             columns empty and sets their values by key"
                .into()
        } else {
            "values of columns added by the agent are compared with NULL: rows whose added \
             columns are not NULL show as deleted and inserted"
                .into()
        });
    }
    let mut patch = TablePatch::default();
    if common.is_empty() {
        diff.note = Some("no column in common with the golden: rows not compared".into());
        return Ok((diff, patch, 0));
    }
    // Emptied (TRUNCATE, DELETE without WHERE): count instead of reading every row.
    let probe = format!("SELECT 1 FROM ONLY {} LIMIT 1", new.qname());
    if scratch.rows(&probe).await?.is_empty() {
        let ref_cols: Vec<&str> = common
            .iter()
            .map(|n| plan.col_old(*n).name.as_str())
            .collect();
        let count = reference
            .rows(&format!(
                "SELECT pg_catalog.count(*) FROM ONLY {}",
                old.qname()
            ))
            .await?;
        diff.deleted = count
            .first()
            .and_then(|r| r[0].as_deref())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let sample = format!(
            "SELECT {} FROM ONLY {} LIMIT {}",
            ref_cols.join(", "),
            old.qname(),
            lim.samples
        );
        let width = diff.columns.len();
        for mut row in reference.rows(&sample).await? {
            row.resize(width, None);
            diff.samples.deleted.push(row);
        }
        if diff.deleted > 0 {
            patch.deletes.push(format!("DELETE FROM {};", new.qname()));
        }
        let read = diff_rows(&diff);
        return Ok((diff, patch, read));
    }
    merge(reference, scratch, &plan, lim, &mut diff, &mut patch).await
}

async fn merge(
    reference: &mut Side,
    scratch: &mut Side,
    plan: &Plan<'_>,
    lim: Limits,
    diff: &mut TableDiff,
    patch: &mut TablePatch,
) -> Result<(TableDiff, TablePatch, u64), ConnError> {
    // The golden has no added columns (all NULL there): it orders by the common ones.
    let order_by = |cols: &dyn Fn(i32) -> String, golden: bool| -> String {
        plan.order
            .iter()
            .filter(|&&(i, _)| !golden || i < plan.common.len())
            .map(|&(i, c)| order_expr(&cols(plan.all[i]), c))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let old_name = |n: i32| plan.col_old(n).name.clone();
    let new_name = |n: i32| plan.col_new(n).name.clone();
    let ref_cols: Vec<String> = plan.common.iter().map(|n| old_name(*n)).collect();
    let new_cols: Vec<String> = plan
        .common
        .iter()
        .chain(plan.added.iter())
        .map(|n| new_name(*n))
        .collect();
    let ob = |s: String| {
        if s.is_empty() {
            String::new()
        } else {
            format!(" ORDER BY {s}")
        }
    };
    let ref_sql = format!(
        "SELECT {} FROM ONLY {}{}",
        ref_cols.join(", "),
        plan.old.qname(),
        ob(order_by(&old_name, true))
    );
    let new_sql = format!(
        "SELECT {} FROM ONLY {}{}",
        new_cols.join(", "),
        plan.new.qname(),
        ob(order_by(&new_name, false))
    );
    let mut ins = Inserts::new(plan.new, &plan.all);
    let width = new_cols.len();
    // Golden rows get NULL for the added columns.
    let fill = |row: Option<TextRow>| {
        row.map(|mut r| {
            r.resize(width, None);
            r
        })
    };
    // Compared for updates: every column but added stored generated ones.
    let compared: Vec<usize> = (0..width)
        .filter(|&i| i < plan.common.len() || plan.col_new(plan.all[i]).generated != "s")
        .collect();
    let mut read = 0u64;
    let mut matched = 0u64;
    {
        let mut rc = reference.cursor(&ref_sql, BATCH).await?;
        let mut sc = scratch.cursor(&new_sql, BATCH).await?;
        let mut r = fill(rc.next().await?);
        let mut s = sc.next().await?;
        loop {
            let ord = match (&r, &s) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(a), Some(b)) => plan.cmp_rows(a, b),
            };
            match ord {
                Ordering::Less => {
                    let Some(row) = r.take() else { break };
                    read += 1;
                    diff.deleted += 1;
                    patch.deletes.push(delete_sql(plan, &row));
                    if diff.samples.deleted.len() < lim.samples {
                        diff.samples.deleted.push(row);
                    }
                    r = fill(rc.next().await?);
                }
                Ordering::Greater => {
                    let Some(row) = s.take() else { break };
                    read += 1;
                    diff.inserted += 1;
                    ins.push(&row, &mut patch.inserts);
                    if diff.samples.inserted.len() < lim.samples {
                        diff.samples.inserted.push(row);
                    }
                    s = sc.next().await?;
                }
                Ordering::Equal => {
                    let (Some(a), Some(b)) = (r.take(), s.take()) else {
                        break;
                    };
                    read += 2;
                    matched += 1;
                    if plan.keyed {
                        let changed: Vec<usize> =
                            compared.iter().copied().filter(|&i| a[i] != b[i]).collect();
                        if !changed.is_empty() {
                            diff.updated += 1;
                            for &i in &changed {
                                *diff.updated_columns.entry(new_cols[i].clone()).or_default() += 1;
                            }
                            if let Some(u) = update_sql(plan, &a, &b, &changed) {
                                patch.updates.push(u);
                            }
                            if diff.samples.updated.len() < lim.samples {
                                diff.samples.updated.push(UpdatedRow {
                                    changed: changed.iter().map(|&i| new_cols[i].clone()).collect(),
                                    before: a,
                                    after: b,
                                });
                            }
                        }
                    }
                    // Both sides advance: fetch their next batches concurrently.
                    let (rn, sn) = tokio::try_join!(rc.next(), sc.next())?;
                    (r, s) = (fill(rn), sn);
                }
            }
        }
        rc.close().await?;
        sc.close().await?;
    }
    ins.flush(&mut patch.inserts);
    // Everything gone (TRUNCATE, DELETE without WHERE): one statement, not one per row.
    if matched == 0 && diff.inserted == 0 && diff.deleted > 1 {
        patch.deletes = vec![format!("DELETE FROM {};", plan.new.qname())];
    }
    Ok((std::mem::take(diff), std::mem::take(patch), read))
}

fn diff_rows(d: &TableDiff) -> u64 {
    d.samples.deleted.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_order_matches_c_collation_with_nulls_last() {
        let v = |s: Option<&str>| s.map(str::to_string);
        assert_eq!(
            cmp_value(&v(None), &v(Some("")), Cmp::Text),
            Ordering::Greater
        );
        assert_eq!(
            cmp_value(&v(Some("B")), &v(Some("a")), Cmp::Text),
            Ordering::Less
        );
        assert_eq!(
            cmp_value(&v(Some("ab")), &v(Some("a")), Cmp::Text),
            Ordering::Greater
        );
        assert_eq!(
            cmp_value(&v(Some("10")), &v(Some("9")), Cmp::Int),
            Ordering::Greater
        );
        assert_eq!(
            cmp_value(&v(None), &v(Some("9")), Cmp::Int),
            Ordering::Greater
        );
    }
}
