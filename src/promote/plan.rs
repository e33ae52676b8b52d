//! What promoting a reviewed change means, worked out from the review's data model (never
//! from the patch text): the guards the target must pass (every updated or deleted row
//! still has its golden values, every inserted key is absent, every schema object is in
//! its golden state), the DDL and the row changes to run, and what cannot be promoted at
//! all (masked values, tables without a key, kinds of schema change not handled).

use std::collections::{BTreeMap, BTreeSet};

use super::kinds;
use super::names::{self, Part};
use super::schema_steps::{masked_in, SchemaSteps};
use crate::review::model::{Action, Review, TableDiff};

pub use super::plan_model::{Counts, Plan, Row, SchemaGuard, TableChange, Want};
pub use super::schema_steps::Masked;

/// A query giving a hash of the values of `col` of `table` (a multiset: the row count and
/// an md5 of the sorted text values), the same in the golden and in a target that did not
/// change them.
pub fn column_hash_sql(table: &str, col: &str) -> String {
    format!(
        "SELECT pg_catalog.count(*)::pg_catalog.text || ':' || COALESCE(pg_catalog.md5(\
         pg_catalog.string_agg(COALESCE(pg_catalog.format('%L', {col}), 'NULL'), ',' \
         ORDER BY pg_catalog.format('%L', {col}) COLLATE \"C\")), '') FROM ONLY {table}"
    )
}

/// Work out the plan of `review` (which must hold every changed row: see
/// [`crate::promote::change`]).
pub fn build(review: &Review, masked: &Masked) -> Plan {
    let mut plan = Plan::default();
    let mut steps = SchemaSteps::default();
    for c in &review.schema {
        steps.place(&mut plan, c, review, masked);
    }
    let added_cols = std::mem::take(&mut steps.added_cols);
    steps.finish(&mut plan);

    let dropped: BTreeSet<&str> = review
        .schema
        .iter()
        .filter(|c| c.kind == "table" && c.action == Action::Dropped)
        .map(|c| c.object.as_str())
        .collect();
    for t in &review.data {
        if let Some(mut tc) = table_change(t, masked, &added_cols, &mut plan.refusals) {
            tc.dropped = dropped.contains(t.table.as_str());
            let retyped = kinds::type_changed(review, &t.table);
            tc.recheck = (0..tc.guard.len())
                .filter(|&j| !retyped.contains(&tc.columns[tc.guard[j]]))
                .collect();
            plan.tables.push(tc);
        }
    }
    for s in &review.sequences {
        if let Some(b) = &s.before {
            plan.sequence_guards.push((s.sequence.clone(), b.clone()));
        }
        plan.setvals.push((s.sequence.clone(), s.after.clone()));
    }
    plan
}

fn table_change(
    t: &TableDiff,
    masked: &Masked,
    added_cols: &BTreeMap<String, BTreeSet<String>>,
    refusals: &mut Vec<String>,
) -> Option<TableChange> {
    let name = &t.table;
    if let Some(e) = &t.error {
        refusals.push(format!("table {name} could not be compared ({e})"));
        return None;
    }
    if t.samples.inserted.len() as u64 != t.inserted
        || t.samples.updated.len() as u64 != t.updated
        || t.samples.deleted.len() as u64 != t.deleted
    {
        refusals.push(format!(
            "table {name}: the review holds only some of its changed rows (a captured change holds all)"
        ));
        return None;
    }
    let parts: Vec<Option<Vec<Part>>> = t.columns.iter().map(|c| names::split(c)).collect();
    if parts.iter().any(|p| p.as_ref().map(|v| v.len()) != Some(1)) {
        refusals.push(format!("table {name}: a column name does not parse"));
        return None;
    }
    let plain: Vec<String> = parts
        .into_iter()
        .map(|p| p.map(|mut v| v.remove(0).plain).unwrap_or_default())
        .collect();
    let new_table = t.matched_by == "new table";
    let mut tc = TableChange {
        table: name.clone(),
        new_table,
        dropped: false,
        multiset: false,
        columns: t.columns.clone(),
        key: Vec::new(),
        guard: Vec::new(),
        recheck: Vec::new(),
        deletes: t.samples.deleted.clone(),
        updates: t
            .samples
            .updated
            .iter()
            .map(|u| {
                let changed = u
                    .changed
                    .iter()
                    .filter_map(|c| t.columns.iter().position(|x| x == c))
                    .collect();
                (u.before.clone(), u.after.clone(), changed)
            })
            .collect(),
        inserts: t.samples.inserted.clone(),
    };
    if new_table {
        return Some(tc);
    }
    let masked_cols = masked_in(masked, name);
    let added = added_cols.get(&names::plain(name));
    if t.key.is_empty() {
        let skip = |c: &String| masked_cols.contains(c) || added.is_some_and(|a| a.contains(c));
        return super::multiset::keyless(tc, &plain, &masked_cols, skip, refusals);
    }
    for k in &t.key {
        match t.columns.iter().position(|c| c == k) {
            Some(i) => tc.key.push(i),
            None => {
                refusals.push(format!(
                    "table {name}: key column {k} is not among its columns"
                ));
                return None;
            }
        }
    }
    let is_masked = |i: usize| masked_cols.contains(&plain[i]);
    let masked_uses = masked_refusals(&tc, &plain, &masked_cols);
    if !masked_uses.is_empty() {
        refusals.extend(
            masked_uses
                .into_iter()
                .map(|why| format!("table {name}: {why}")),
        );
        return None;
    }
    tc.guard = (0..t.columns.len())
        .filter(|&i| !is_masked(i) && !added.is_some_and(|a| a.contains(&plain[i])))
        .collect();
    Some(tc)
}

/// Why the rows of a keyed table cannot be promoted for its masked columns: rows found by
/// a masked key, inserts carrying masked values, updates writing masked columns (masked
/// values are the golden's stand-ins, never the real ones).
fn masked_refusals(
    tc: &TableChange,
    plain: &[String],
    masked_cols: &BTreeSet<String>,
) -> Vec<String> {
    let mut why = Vec::new();
    let is_masked = |i: usize| masked_cols.contains(&plain[i]);
    if !(tc.deletes.is_empty() && tc.updates.is_empty()) {
        if let Some(&k) = tc.key.iter().find(|&&k| is_masked(k)) {
            why.push(format!(
                "rows are found by key column {}, which is masked (the golden's key is not the real one)",
                tc.columns[k]
            ));
        }
    }
    if !tc.inserts.is_empty() && !masked_cols.is_empty() {
        let cols: Vec<&str> = plain
            .iter()
            .filter(|c| masked_cols.contains(*c))
            .map(|c| c.as_str())
            .collect();
        why.push(format!(
            "inserted rows carry values for masked columns ({}), which are never written back",
            cols.join(", ")
        ));
    }
    let mut written: BTreeSet<usize> = BTreeSet::new();
    for (_, _, changed) in &tc.updates {
        written.extend(changed.iter().copied().filter(|&i| is_masked(i)));
    }
    if !written.is_empty() {
        let cols: Vec<&str> = written.iter().map(|&i| plain[i].as_str()).collect();
        why.push(format!(
            "updates write masked columns ({}), whose values are never written back",
            cols.join(", ")
        ));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::model::{Samples, SchemaChange, UpdatedRow};

    fn v(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    fn review() -> Review {
        Review {
            schema: vec![SchemaChange {
                kind: "column".into(),
                action: Action::Added,
                object: "public.customers.note".into(),
                detail: String::new(),
                before: None,
                after: Some("note text NOT NULL".into()),
                sql: Vec::new(),
            }],
            data: vec![TableDiff {
                table: "public.customers".into(),
                matched_by: "primary key".into(),
                key: vec!["id".into()],
                columns: vec!["id".into(), "email".into(), "city".into(), "note".into()],
                updated: 1,
                samples: Samples {
                    updated: vec![UpdatedRow {
                        before: vec![v("1"), v("a@x"), v("Oslo"), None],
                        after: vec![v("1"), v("a@x"), v("Bergen"), v("n")],
                        changed: vec!["city".into()],
                    }],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn guards_leave_out_masked_and_added_columns() {
        let masked: Masked = ["public.customers.email".to_string()].into();
        let p = build(&review(), &masked);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        assert_eq!(p.tables[0].guard, vec![0, 2]);
        assert_eq!(
            p.before_data,
            vec!["ALTER TABLE public.customers ADD COLUMN note text;"]
        );
        assert_eq!(
            p.after_data,
            vec!["ALTER TABLE public.customers ALTER COLUMN note SET NOT NULL;"]
        );
        assert_eq!(p.schema_guards[0].want, Want::Absent);
    }

    #[test]
    fn writing_a_masked_column_is_refused_with_the_column_named() {
        let mut r = review();
        r.data[0].samples.updated[0].changed = vec!["email".into()];
        let masked: Masked = ["public.customers.email".to_string()].into();
        let p = build(&r, &masked);
        assert_eq!(p.refusals.len(), 1, "{:?}", p.refusals);
        assert!(
            p.refusals[0].contains("masked columns (email)"),
            "{:?}",
            p.refusals
        );
        // A masked key cannot find the real row.
        let masked: Masked = ["public.customers.id".to_string()].into();
        let p = build(&review(), &masked);
        assert!(
            p.refusals[0].contains("key column id, which is masked"),
            "{:?}",
            p.refusals
        );
    }

    #[test]
    fn cut_samples_and_keyless_tables_are_refused() {
        let mut r = review();
        r.data[0].updated = 2;
        assert!(build(&r, &Masked::new()).refusals[0].contains("only some"));
        // Without a key, updated rows cannot be found; deleted ones are (as a multiset).
        let mut r = review();
        r.data[0].key.clear();
        assert!(build(&r, &Masked::new()).refusals[0].contains("no primary key"));
        r.data[0].updated = 0;
        r.data[0].deleted = 1;
        r.data[0].samples.deleted = vec![r.data[0].samples.updated[0].before.clone()];
        r.data[0].samples.updated.clear();
        let p = build(&r, &Masked::new());
        assert!(
            p.refusals.is_empty() && p.tables[0].multiset,
            "{:?}",
            p.refusals
        );
        assert_eq!(
            p.tables[0].guard,
            vec![0, 1, 2],
            "the added column is not compared"
        );
        let masked: Masked = ["public.customers.email".to_string()].into();
        assert!(build(&r, &masked).refusals[0].contains("no key and masked columns (email)"));
    }
}
