//! The patch statements of one table's row changes: typed literals of the values' text
//! output, rows picked by key (or, without one, one identical row by its text output).

use super::{Plan, INSERT_BATCH};
use crate::review::catalog::{Column, Table};
use crate::review::conn::{literal, TextRow};

fn typed(v: &Option<String>, c: &Column) -> String {
    match v {
        None => "NULL".into(),
        Some(s) => format!("{}::{}", literal(s), c.type_name),
    }
}

/// WHERE clause selecting a row by key (keyed tables).
pub(super) fn key_where(plan: &Plan<'_>, row: &TextRow) -> String {
    plan.order
        .iter()
        .map(|&(i, _)| {
            let c = plan.col_new(plan.all[i]);
            format!("{} = {}", c.name, typed(&row[i], c))
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

pub(super) fn delete_sql(plan: &Plan<'_>, row: &TextRow) -> String {
    let t = plan.new.qname();
    if plan.keyed {
        return format!("DELETE FROM {t} WHERE {};", key_where(plan, row));
    }
    // No key: delete one occurrence of an identical row (compared by text output, as the
    // diff did).
    let cond: Vec<String> = plan
        .order
        .iter()
        .map(|&(i, _)| {
            let c = &plan.col_new(plan.all[i]).name;
            match &row[i] {
                None => format!("{c} IS NULL"),
                Some(v) => format!("pg_catalog.format('%s', {c}) = {}", literal(v)),
            }
        })
        .collect();
    format!(
        "DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE {} LIMIT 1);",
        cond.join(" AND ")
    )
}

pub(super) fn update_sql(
    plan: &Plan<'_>,
    before: &TextRow,
    after: &TextRow,
    changed: &[usize],
) -> Option<String> {
    let sets: Vec<String> = changed
        .iter()
        .filter_map(|&i| {
            let c = plan.col_new(plan.all[i]);
            // An added identity column is a plain one while the patch fills it.
            let identity_always = c.identity == "a" && i < plan.common.len();
            (c.generated != "s" && !identity_always)
                .then(|| format!("{} = {}", c.name, typed(&after[i], c)))
        })
        .collect();
    if sets.is_empty() {
        return None;
    }
    Some(format!(
        "UPDATE {} SET {} WHERE {};",
        plan.new.qname(),
        sets.join(", "),
        key_where(plan, before)
    ))
}

/// Multi-row INSERT builder (generated columns are left out; identity ALWAYS overridden).
pub(super) struct Inserts {
    head: String,
    cols: Vec<(usize, Column)>,
    rows: Vec<String>,
}

impl Inserts {
    pub(super) fn new(t: &Table, attnums: &[i32]) -> Inserts {
        let cols: Vec<(usize, Column)> = attnums
            .iter()
            .enumerate()
            .filter_map(|(i, n)| t.column(*n).map(|c| (i, c.clone())))
            .filter(|(_, c)| c.generated != "s")
            .collect();
        let names: Vec<&str> = cols.iter().map(|(_, c)| c.name.as_str()).collect();
        let overriding = if cols.iter().any(|(_, c)| c.identity == "a") {
            " OVERRIDING SYSTEM VALUE"
        } else {
            ""
        };
        Inserts {
            head: format!(
                "INSERT INTO {} ({}){overriding} VALUES\n",
                t.qname(),
                names.join(", ")
            ),
            cols,
            rows: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, row: &TextRow, out: &mut Vec<String>) {
        let vals: Vec<String> = self.cols.iter().map(|(i, c)| typed(&row[*i], c)).collect();
        self.rows.push(format!("  ({})", vals.join(", ")));
        if self.rows.len() >= INSERT_BATCH {
            self.flush(out);
        }
    }

    pub(super) fn flush(&mut self, out: &mut Vec<String>) {
        if !self.rows.is_empty() {
            out.push(format!("{}{};", self.head, self.rows.join(",\n")));
            self.rows.clear();
        }
    }
}
