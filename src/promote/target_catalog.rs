//! Reading a promotion plan against the target's catalog: schema guards compared with the
//! golden's definitions, the row changes put in the order the review's patch uses, and how a
//! row or a value is named in a conflict. Pure over a [`Catalog`] already read; the
//! transaction that uses it is `apply.rs`.

use std::collections::BTreeMap;

use super::names;
use super::plan_model::{Plan, Row, SchemaGuard, TableChange, Want};
use crate::review::catalog::{Catalog, Table};
use crate::review::conn::literal;
use crate::review::diff::data_order::{self, Step};

/// A value for `col` of `table` in the target's catalog, cast to its type when known.
pub(super) fn value(table: Option<&Table>, col: &str, v: &Option<String>) -> String {
    match v {
        None => "NULL".into(),
        Some(s) => match table.and_then(|t| t.columns.iter().find(|c| c.name == col)) {
            Some(c) => format!("{}::{}", literal(s), c.type_name),
            None => literal(s),
        },
    }
}

pub(super) fn describe_key(tc: &TableChange, row: &Row) -> String {
    let cols: Vec<&str> = tc.key.iter().map(|&i| tc.columns[i].as_str()).collect();
    let vals: Vec<String> = tc
        .key
        .iter()
        .map(|&i| row[i].clone().unwrap_or_else(|| "NULL".into()))
        .collect();
    format!(
        "{} row ({})=({})",
        tc.table,
        cols.join(", "),
        vals.join(", ")
    )
}

pub(super) fn tables_by_name(cat: &Catalog) -> BTreeMap<String, (u32, &Table)> {
    cat.tables
        .iter()
        .map(|(oid, t)| (t.qname(), (*oid, t)))
        .collect()
}

/// The definition of a schema object in `cat` found by kind and qualified name.
pub(super) fn definition(cat: &Catalog, kind: &str, object: &str) -> Option<String> {
    let tables = tables_by_name(cat);
    match kind {
        "table" => tables
            .get(object)
            .map(|(_, t)| crate::review::schema::create_table(t)),
        "column" => {
            let (table, col) = names::parent_and_last(object)?;
            let (_, t) = tables.get(&table)?;
            t.columns
                .iter()
                .find(|c| c.name == col.quoted)
                .map(|c| c.definition())
        }
        "sequence" => cat
            .sequences
            .values()
            .find(|s| s.qname() == object)
            .map(|s| s.params.clone()),
        "view" => cat
            .views
            .values()
            .find(|v| format!("{}.{}", v.schema, v.name) == object)
            .map(|v| v.def.clone()),
        "index" => cat
            .indexes
            .values()
            .find(|i| format!("{}.{}", i.schema, i.name) == object)
            .map(|i| i.def.clone()),
        "constraint" => {
            let (table, name) = names::parent_and_last(object)?;
            let (oid, _) = tables.get(&table)?;
            cat.constraints
                .values()
                .find(|k| k.table == *oid && k.name == name.quoted)
                .map(|k| k.def.clone())
        }
        _ => None,
    }
}

pub(super) fn schema_conflicts(guards: &[SchemaGuard], cat: &Catalog) -> Vec<String> {
    let mut out = Vec::new();
    for g in guards {
        let now = definition(cat, &g.kind, &g.object);
        match (&g.want, now) {
            (Want::Absent, Some(_)) => out.push(format!(
                "{} {}: exists in the target, the golden had no such object",
                g.kind, g.object
            )),
            (Want::Def(_) | Want::Exists, None) => {
                out.push(format!("{} {}: missing from the target", g.kind, g.object))
            }
            (Want::Def(want), Some(now)) if *want != now => out.push(format!(
                "{} {}: changed since the golden (golden: {want}; target: {now})",
                g.kind, g.object
            )),
            _ => {}
        }
    }
    out
}

/// The row changes in the order the review's patch uses ([`data_order`]: re-pointing
/// updates before the deletes they unblock, parents' inserts before children's), over the
/// target's foreign keys as they are once the DDL before the data ran.
pub(super) struct RowOrder<'p, 'c> {
    pub(super) steps: Vec<(&'p TableChange, &'c Table, Step)>,
    /// Keys on a cycle of tables, made deferrable while the rows change, and set back.
    pub(super) before: Vec<String>,
    pub(super) after: Vec<String>,
    /// Tables with changes that the target does not have.
    pub(super) missing: Vec<&'p TableChange>,
}

pub(super) fn row_order<'p, 'c>(cat: &'c Catalog, plan: &'p Plan) -> RowOrder<'p, 'c> {
    let tables = tables_by_name(cat);
    let mut present: BTreeMap<u32, Vec<Step>> = BTreeMap::new();
    let mut by_oid: BTreeMap<u32, &TableChange> = BTreeMap::new();
    let mut missing = Vec::new();
    // A dropped table's rows go with it (its DROP ran before the data).
    for tc in plan.tables.iter().filter(|t| !t.dropped) {
        let Some((oid, _)) = tables.get(&tc.table) else {
            missing.push(tc);
            continue;
        };
        let steps: Vec<Step> = [
            (Step::Delete, tc.deletes.is_empty()),
            (Step::Update, tc.updates.is_empty()),
            (Step::Insert, tc.inserts.is_empty()),
        ]
        .iter()
        .filter(|(_, empty)| !empty)
        .map(|(s, _)| *s)
        .collect();
        if !steps.is_empty() {
            present.insert(*oid, steps);
            by_oid.insert(*oid, tc);
        }
    }
    let o = data_order::order(cat, cat, &present);
    let steps = o
        .steps
        .iter()
        .filter_map(|(oid, step)| Some((*by_oid.get(oid)?, cat.tables.get(oid)?, *step)))
        .collect();
    RowOrder {
        steps,
        before: o.before,
        after: o.after,
        missing,
    }
}
