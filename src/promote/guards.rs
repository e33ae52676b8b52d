//! Set-based row guards and changes: the rows a table change deletes, updates or inserts
//! are loaded into one temporary table in the target (their key, the golden's values of the
//! guarded columns, the new values), then one statement per table and kind locks and
//! compares them, one lists the inserted keys already present, one deletes and one per set
//! of changed columns updates — each required to touch exactly the rows it names. A 50 k-row
//! update is a few statements, not 50 k.

use super::plan::{Row, TableChange};
use crate::review::catalog::Table;
use crate::review::conn::{literal, ConnError, Side};

/// Rows per INSERT into the temporary table.
const LOAD_BATCH: usize = 1000;

/// The rows of one table change, loaded in the target.
pub struct Loaded {
    /// `pg_temp.sandpit_rows_<n>`.
    pub name: String,
    /// Sets of changed column positions (update groups, by `grp`).
    groups: Vec<Vec<usize>>,
}

/// A row that does not pass its guard.
pub enum Mismatch<'a> {
    /// Its key is gone (deleted or updated row).
    Gone(&'a Row, &'static str),
    /// Guarded columns differ.
    Changed(&'a Row, &'static str, Vec<&'a str>),
    /// An inserted key exists already.
    Present(&'a Row),
}

fn cast(t: &Table, col: &str, e: &str) -> String {
    match t.columns.iter().find(|c| c.name == col) {
        Some(c) => format!("{e}::{}", c.type_name),
        None => e.to_string(),
    }
}

fn lit(v: &Option<String>) -> String {
    v.as_ref()
        .map(|s| literal(s))
        .unwrap_or_else(|| "NULL".into())
}

/// `t`'s key equal to the loaded row's `e`.
fn key_join(tc: &TableChange, t: &Table) -> String {
    tc.key
        .iter()
        .enumerate()
        .map(|(j, &i)| {
            format!(
                "t.{c} OPERATOR(pg_catalog.=) {}",
                cast(t, &tc.columns[i], &format!("e.k{j}")),
                c = tc.columns[i]
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// Per guarded column: whether `t` still has the golden's value (with `again`, only the
/// columns the delete and update compare again: see [`TableChange::recheck`]).
fn guard_oks(tc: &TableChange, again: bool) -> Vec<String> {
    tc.guard
        .iter()
        .enumerate()
        .filter(|(j, _)| !again || tc.recheck.contains(j))
        .map(|(j, &i)| {
            format!(
                // %L: NULL is `NULL`, any value a quoted literal of its text output
                // (%s would make NULL and '' alike).
                "(pg_catalog.format('%L', t.{}) OPERATOR(pg_catalog.=) pg_catalog.format('%L', e.g{j}))",
                tc.columns[i]
            )
        })
        .collect()
}

fn all(oks: &[String]) -> String {
    if oks.is_empty() {
        "true".into()
    } else {
        oks.join(" AND ")
    }
}

/// Row `n` of the loaded table: (kind, row).
fn nth(tc: &TableChange, n: usize) -> Option<(&'static str, &Row)> {
    let d = tc.deletes.len();
    let u = tc.updates.len();
    if n < d {
        Some(("deleted", &tc.deletes[n]))
    } else if n < d + u {
        Some(("updated", &tc.updates[n - d].0))
    } else {
        tc.inserts.get(n - d - u).map(|r| ("inserted", r))
    }
}

/// Load the rows of `tc` into temporary table number `n` (dropped at commit).
pub async fn load(side: &Side, tc: &TableChange, n: usize) -> Result<Loaded, ConnError> {
    let name = format!("pg_temp.sandpit_rows_{n}");
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut cols = vec!["n int".to_string(), "kind text".into(), "grp int".into()];
    cols.extend((0..tc.key.len()).map(|j| format!("k{j} text")));
    cols.extend((0..tc.guard.len()).map(|j| format!("g{j} text")));
    cols.extend((0..tc.columns.len()).map(|j| format!("a{j} text")));
    side.exec(&format!(
        "CREATE TEMP TABLE {name} ({}) ON COMMIT DROP",
        cols.join(", ")
    ))
    .await?;
    let none: Row = vec![None; tc.columns.len()];
    let mut values: Vec<String> = Vec::new();
    let rows = tc
        .deletes
        .iter()
        .map(|r| ("d", r, &none, None))
        .chain(tc.updates.iter().map(|(b, a, ch)| ("u", b, a, Some(ch))))
        .chain(tc.inserts.iter().map(|r| ("i", r, &none, None)));
    for (i, (kind, golden, after, changed)) in rows.enumerate() {
        let grp = match changed {
            Some(ch) => match groups.iter().position(|g| g == ch) {
                Some(p) => p,
                None => {
                    groups.push(ch.clone());
                    groups.len() - 1
                }
            },
            None => 0,
        };
        let mut v = vec![i.to_string(), literal(kind), grp.to_string()];
        v.extend(tc.key.iter().map(|&k| lit(&golden[k])));
        v.extend(tc.guard.iter().map(|&g| lit(&golden[g])));
        v.extend(after.iter().map(lit));
        values.push(format!("({})", v.join(", ")));
        if values.len() == LOAD_BATCH {
            side.exec(&format!("INSERT INTO {name} VALUES {}", values.join(", ")))
                .await?;
            values.clear();
        }
    }
    if !values.is_empty() {
        side.exec(&format!("INSERT INTO {name} VALUES {}", values.join(", ")))
            .await?;
    }
    side.exec(&format!("ANALYZE {name}")).await?;
    Ok(Loaded { name, groups })
}

/// Lock the guarded rows and list every one that does not pass (before anything runs).
pub async fn check<'a>(
    side: &Side,
    tc: &'a TableChange,
    t: &Table,
    l: &Loaded,
) -> Result<Vec<Mismatch<'a>>, ConnError> {
    let join = key_join(tc, t);
    let oks = guard_oks(tc, false);
    side.exec(&format!(
        "SELECT 1 FROM ONLY {tab} t JOIN {e} e ON {join} WHERE e.kind <> 'i' FOR UPDATE OF t",
        tab = tc.table,
        e = l.name
    ))
    .await?;
    let q = format!(
        "SELECT e.n, e.kind, t.ctid IS NULL{} FROM {e} e LEFT JOIN ONLY {tab} t ON {join} \
         WHERE (e.kind <> 'i' AND (t.ctid IS NULL OR NOT ({}))) OR (e.kind = 'i' AND t.ctid IS NOT NULL) \
         ORDER BY e.n",
        oks.iter().map(|o| format!(", {o}")).collect::<String>(),
        all(&oks),
        e = l.name,
        tab = tc.table
    );
    let mut out = Vec::new();
    for r in side.rows(&q).await? {
        let n: usize = r[0].as_deref().and_then(|s| s.parse().ok()).unwrap_or(0);
        let Some((what, row)) = nth(tc, n) else {
            continue;
        };
        if r[1].as_deref() == Some("i") {
            out.push(Mismatch::Present(row));
        } else if r[2].as_deref() == Some("t") {
            out.push(Mismatch::Gone(row, what));
        } else {
            let differ = tc
                .guard
                .iter()
                .enumerate()
                .filter(|(j, _)| r[3 + j].as_deref() != Some("t"))
                .map(|(_, &i)| tc.columns[i].as_str())
                .collect();
            out.push(Mismatch::Changed(row, what, differ));
        }
    }
    Ok(out)
}

async fn count(side: &Side, sql: &str) -> Result<usize, ConnError> {
    let r = side
        .rows(&format!(
            "WITH c AS ({sql} RETURNING 1) SELECT count(*) FROM c"
        ))
        .await?;
    Ok(r.first()
        .and_then(|r| r[0].as_deref())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0))
}

/// Delete the loaded rows; the number deleted (want `tc.deletes.len()`).
pub async fn delete(
    side: &Side,
    tc: &TableChange,
    t: &Table,
    l: &Loaded,
) -> Result<usize, ConnError> {
    count(
        side,
        &format!(
            "DELETE FROM ONLY {tab} t USING {e} e WHERE e.kind = 'd' AND {} AND {}",
            key_join(tc, t),
            all(&guard_oks(tc, true)),
            tab = tc.table,
            e = l.name
        ),
    )
    .await
}

/// Update the loaded rows, one statement per set of changed columns; (rows touched, rows
/// meant) per statement.
pub async fn update(
    side: &Side,
    tc: &TableChange,
    t: &Table,
    l: &Loaded,
) -> Result<Vec<(usize, usize)>, ConnError> {
    let mut out = Vec::new();
    for (g, changed) in l.groups.iter().enumerate() {
        // Generated columns and identity columns that are always generated follow.
        let sets: Vec<String> = changed
            .iter()
            .filter(|&&i| {
                let c = t.columns.iter().find(|c| c.name == tc.columns[i]);
                c.is_none_or(|c| c.generated != "s" && c.identity != "a")
            })
            .map(|&i| {
                format!(
                    "{} = {}",
                    tc.columns[i],
                    cast(t, &tc.columns[i], &format!("e.a{i}"))
                )
            })
            .collect();
        let meant = tc.updates.iter().filter(|(_, _, c)| c == changed).count();
        if sets.is_empty() {
            continue;
        }
        let got = count(
            side,
            &format!(
                "UPDATE ONLY {tab} t SET {} FROM {e} e WHERE e.kind = 'u' AND e.grp = {g} AND {} AND {}",
                sets.join(", "),
                key_join(tc, t),
                all(&guard_oks(tc, true)),
                tab = tc.table,
                e = l.name
            ),
        )
        .await?;
        out.push((got, meant));
    }
    Ok(out)
}
