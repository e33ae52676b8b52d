//! What promoting a reviewed change means, worked out from the review's data model (never
//! from the patch text): the guards the target must pass (every updated or deleted row
//! still has its golden values, every inserted key is absent, every schema object is in
//! its golden state), the DDL and the row changes to run, and what cannot be promoted at
//! all (masked values, tables without a key, kinds of schema change not handled).

use std::collections::{BTreeMap, BTreeSet};

use super::kinds;
use super::names::{self, Part};
use crate::review::model::{Action, Review, TableDiff};
use crate::review::sql::order;

pub use super::plan_model::{Counts, Plan, Row, SchemaGuard, TableChange, Want};

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

/// Whether `owner` (`OWNED BY schema.table.column`) goes with a table or column the
/// review drops (or is an identity column's, dropped with it).
fn owned_by_dropped(owner: &str, review: &Review) -> bool {
    let Some(col) = owner.strip_prefix("OWNED BY ") else {
        return false;
    };
    if col == "an identity column" {
        return true;
    }
    let table = names::parent_and_last(col).map(|(t, _)| t);
    review.schema.iter().any(|c| {
        c.action == Action::Dropped
            && ((c.kind == "column" && c.object == col)
                || (c.kind == "table" && Some(&c.object) == table.as_ref()))
    })
}

/// Masked columns of the golden, as plain `schema.table.column`.
pub type Masked = BTreeSet<String>;

fn masked_in(masked: &Masked, table: &str) -> BTreeSet<String> {
    let t = names::plain(table);
    masked
        .iter()
        .filter_map(|m| {
            let (tab, col) = m.rsplit_once('.')?;
            (tab == t).then(|| col.to_string())
        })
        .collect()
}

/// Work out the plan of `review` (which must hold every changed row: see
/// [`crate::promote::change`]).
pub fn build(review: &Review, masked: &Masked) -> Plan {
    let mut plan = Plan::default();
    let mut before: Vec<(u32, String)> = Vec::new();
    let mut after: Vec<(u32, String)> = Vec::new();
    let mut renames: Vec<(u32, String)> = Vec::new();
    // Columns the task added, per table (their values have no golden to guard against).
    let mut added_cols: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in &review.schema {
        let refuse = |plan: &mut Plan, why: &str| {
            plan.refusals.push(format!(
                "{} {} {}: {why}",
                c.kind,
                c.object,
                c.action.word()
            ))
        };
        let guard = |plan: &mut Plan, want: Want| {
            plan.schema_guards.push(SchemaGuard {
                kind: c.kind.clone(),
                object: c.object.clone(),
                want,
            })
        };
        match (c.kind.as_str(), c.action) {
            ("table", Action::Added) => {
                let Some(sql) = c.after.clone() else {
                    refuse(&mut plan, "no definition in the review");
                    continue;
                };
                guard(&mut plan, Want::Absent);
                if sql.contains(" AS IDENTITY") {
                    plan.identity_tables.push(sql);
                } else {
                    before.push((order::CREATE_TABLE, sql));
                }
            }
            ("table", Action::Dropped) => {
                if !masked_in(masked, &c.object).is_empty() {
                    refuse(
                        &mut plan,
                        "the table has masked columns: its real values were never reviewed",
                    );
                    continue;
                }
                let Some(def) = c.before.clone() else {
                    refuse(&mut plan, "no golden definition in the review");
                    continue;
                };
                guard(&mut plan, Want::Def(def));
                before.push((order::DROP_TABLE, format!("DROP TABLE {};", c.object)));
            }
            ("column", Action::Added) => {
                let (Some((table, col)), Some(def)) =
                    (names::parent_and_last(&c.object), c.after.clone())
                else {
                    refuse(&mut plan, "no definition in the review");
                    continue;
                };
                guard(&mut plan, Want::Absent);
                added_cols
                    .entry(names::plain(&table))
                    .or_default()
                    .insert(col.plain.clone());
                match def.strip_suffix(" NOT NULL") {
                    Some(nullable) => {
                        before.push((
                            order::ADD_COLUMN,
                            format!("ALTER TABLE {table} ADD COLUMN {nullable};"),
                        ));
                        after.push((
                            order::SET_NOT_NULL,
                            format!(
                                "ALTER TABLE {table} ALTER COLUMN {} SET NOT NULL;",
                                col.quoted
                            ),
                        ));
                    }
                    None => before.push((
                        order::ADD_COLUMN,
                        format!("ALTER TABLE {table} ADD COLUMN {def};"),
                    )),
                }
            }
            ("column", Action::Dropped) => {
                let (Some((table, col)), Some(def)) =
                    (names::parent_and_last(&c.object), c.before.clone())
                else {
                    refuse(&mut plan, "no golden definition in the review");
                    continue;
                };
                if masked.contains(&names::plain(&c.object)) {
                    refuse(
                        &mut plan,
                        "the column is masked: its real values were never reviewed",
                    );
                    continue;
                }
                guard(&mut plan, Want::Def(def));
                before.push((
                    order::DROP_COLUMN,
                    format!("ALTER TABLE {table} DROP COLUMN {};", col.quoted),
                ));
            }
            ("index", Action::Added) => {
                let Some(def) = c.after.clone() else {
                    refuse(&mut plan, "no definition in the review");
                    continue;
                };
                guard(&mut plan, Want::Absent);
                after.push((order::CREATE_INDEX, format!("{def};")));
            }
            ("index", Action::Dropped) => {
                let Some(def) = c.before.clone() else {
                    refuse(&mut plan, "no golden definition in the review");
                    continue;
                };
                guard(&mut plan, Want::Def(def));
                before.push((order::DROP_INDEX, format!("DROP INDEX {};", c.object)));
            }
            ("constraint", Action::Added) => {
                let (Some((table, name)), Some(def)) =
                    (names::parent_and_last(&c.object), c.after.clone())
                else {
                    refuse(&mut plan, "no definition in the review");
                    continue;
                };
                guard(&mut plan, Want::Absent);
                let rank = if def.starts_with("FOREIGN KEY") {
                    order::ADD_FK
                } else {
                    order::ADD_CONSTRAINT
                };
                after.push((
                    rank,
                    format!("ALTER TABLE {table} ADD CONSTRAINT {} {def};", name.quoted),
                ));
            }
            ("constraint", Action::Dropped) => {
                let (Some((table, name)), Some(def)) =
                    (names::parent_and_last(&c.object), c.before.clone())
                else {
                    refuse(&mut plan, "no golden definition in the review");
                    continue;
                };
                let rank = if def.starts_with("FOREIGN KEY") {
                    order::DROP_FK
                } else {
                    order::DROP_CONSTRAINT
                };
                guard(&mut plan, Want::Def(def));
                before.push((
                    rank,
                    format!("ALTER TABLE {table} DROP CONSTRAINT {};", name.quoted),
                ));
            }
            ("sequence", Action::Added) => match &c.after {
                // Before the tables whose defaults call it; OWNED BY once they exist.
                Some(made) => {
                    guard(&mut plan, Want::Absent);
                    for (i, stmt) in made.lines().enumerate() {
                        if i == 0 {
                            before.push((order::CREATE_SEQUENCE, stmt.to_string()));
                        } else {
                            after.push((order::OWNED_BY, stmt.to_string()));
                        }
                    }
                }
                // An identity column's own (or a review from before `after` was kept).
                None => plan
                    .create_sequences
                    .push((c.object.clone(), c.detail.clone())),
            },
            ("sequence", Action::Dropped) => match c.before.as_deref() {
                None => before.push((order::DROP_SEQUENCE, format!("DROP SEQUENCE {};", c.object))),
                Some(owner) if owned_by_dropped(owner, review) => {}
                Some(owner) => refuse(
                    &mut plan,
                    &format!("it was {owner}, which the change keeps: not promoted"),
                ),
            },
            _ => match kinds::place(c) {
                kinds::Placed::Refused(why) => refuse(&mut plan, &why),
                kinds::Placed::Renames => {
                    kinds::guards(c, &mut plan);
                    renames.extend(c.sql.iter().cloned());
                }
                kinds::Placed::Stmts(stmts) => {
                    kinds::guards(c, &mut plan);
                    for (o, s) in stmts {
                        if kinds::after_data(o) {
                            after.push((o, s));
                        } else {
                            before.push((o, s));
                        }
                    }
                }
            },
        }
    }
    // Stable sorts: within one place, the review's patch order.
    for v in [&mut before, &mut after, &mut renames] {
        v.sort_by_key(|(r, _)| *r);
    }
    plan.before_data = before.into_iter().map(|(_, s)| s).collect();
    plan.after_data = after.into_iter().map(|(_, s)| s).collect();
    plan.renames = renames.into_iter().map(|(_, s)| s).collect();

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
    let before = refusals.len();
    let is_masked = |i: usize| masked_cols.contains(&plain[i]);
    if !(tc.deletes.is_empty() && tc.updates.is_empty()) {
        if let Some(&k) = tc.key.iter().find(|&&k| is_masked(k)) {
            refusals.push(format!(
                "table {name}: rows are found by key column {}, which is masked (the golden's key is not the real one)",
                t.columns[k]
            ));
        }
    }
    if !tc.inserts.is_empty() && !masked_cols.is_empty() {
        let cols: Vec<&String> = plain.iter().filter(|c| masked_cols.contains(*c)).collect();
        refusals.push(format!(
            "table {name}: inserted rows carry values for masked columns ({}), which are never written back",
            cols.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    let mut written: BTreeSet<usize> = BTreeSet::new();
    for (_, _, changed) in &tc.updates {
        written.extend(changed.iter().copied().filter(|&i| is_masked(i)));
    }
    if !written.is_empty() {
        refusals.push(format!(
            "table {name}: updates write masked columns ({}), whose values are never written back",
            written
                .iter()
                .map(|&i| plain[i].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if refusals.len() > before {
        return None;
    }
    tc.guard = (0..t.columns.len())
        .filter(|&i| !is_masked(i) && !added.is_some_and(|a| a.contains(&plain[i])))
        .collect();
    Some(tc)
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
