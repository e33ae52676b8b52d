//! Tables without a key: their rows are matched as a multiset. Inserts need no guard; the
//! rows a change deletes are guarded by a hash of the whole table, taken from the golden when
//! the token ends and compared in the target before anything runs, then each is deleted
//! once by its values.

use std::collections::BTreeSet;

use super::plan_model::TableChange;

/// A query giving a hash of the rows of `table` over `cols` (the row count and an md5 of
/// the sorted rows, each value as a literal so NULL and '' differ).
pub fn hash_sql(table: &str, cols: &[String]) -> String {
    let row: Vec<String> = cols
        .iter()
        .map(|c| format!("pg_catalog.format('%L', {c})"))
        .collect();
    let row = row.join(" || ',' || ");
    format!(
        "SELECT pg_catalog.count(*)::pg_catalog.text || ':' || COALESCE(pg_catalog.md5(\
         pg_catalog.string_agg({row}, '|' ORDER BY {row} COLLATE \"C\")), '') FROM ONLY {table}"
    )
}

/// A table without a key: matched as a multiset. Inserts need no guard; deletes are
/// guarded by the whole table's hash (taken from the golden when the change is captured),
/// so they need columns to compare that the golden had and the masking left real.
pub fn keyless(
    mut tc: TableChange,
    plain: &[String],
    masked_cols: &BTreeSet<String>,
    skip: impl Fn(&String) -> bool,
    refusals: &mut Vec<String>,
) -> Option<TableChange> {
    let name = tc.table.clone();
    if !tc.updates.is_empty() {
        refusals.push(format!(
            "table {name} has no primary key or usable unique index: its updated rows cannot be found"
        ));
        return None;
    }
    let masked_written: Vec<&str> = plain
        .iter()
        .filter(|c| masked_cols.contains(*c))
        .map(String::as_str)
        .collect();
    let writes_rows = !(tc.deletes.is_empty() && tc.inserts.is_empty());
    if !masked_written.is_empty() && writes_rows {
        refusals.push(format!(
            "table {name} has no key and masked columns ({}): its rows cannot be told apart \
             from the golden's fakes",
            masked_written.join(", ")
        ));
        return None;
    }
    tc.guard = (0..plain.len()).filter(|&i| !skip(&plain[i])).collect();
    if !tc.deletes.is_empty() && tc.guard.is_empty() {
        refusals.push(format!(
            "table {name} has no key and no column the golden had: its deleted rows cannot be found"
        ));
        return None;
    }
    tc.recheck = (0..tc.guard.len()).collect();
    tc.multiset = true;
    Some(tc)
}
