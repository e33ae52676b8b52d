//! Rebase onto a moving target: rows the task inserted with keys its serial or identity
//! sequence generated get fresh keys from the target's sequence, and every reference the
//! change makes to them through a foreign key (the target's, or one the change adds) is
//! remapped; the sequence is then neither guarded nor set. A sequence that moved without
//! generating inserted keys (the task set it, or used it elsewhere) keeps its guard. The keys
//! are computed from the sequence's position without consuming any; they are taken with
//! `nextval` only once every guard has passed, and never in a dry run.

use std::collections::BTreeMap;

use super::plan::{Plan, TableChange};
use crate::review::catalog::Catalog;
use crate::review::conn::{literal, ConnError, Side};

/// Old key → fresh key, per (table, column).
type Remap = BTreeMap<(String, String), BTreeMap<i64, i64>>;

/// `FOREIGN KEY (a) REFERENCES s.t(b)` → (a, s.t, b), single-column keys only.
pub fn parse_fk(def: &str) -> Option<(String, String, String)> {
    let rest = def.split("FOREIGN KEY (").nth(1)?;
    let (child, rest) = rest.split_once(") REFERENCES ")?;
    let (parent, rest) = rest.split_once('(')?;
    let (pcol, _) = rest.split_once(')')?;
    if child.contains(',') || pcol.contains(',') {
        return None;
    }
    Some((
        child.trim().into(),
        parent.trim().into(),
        pcol.trim().into(),
    ))
}

/// Foreign keys in force for the rows: (child table, child column, parent table, parent
/// column), from the target's catalog and the constraints the plan adds.
fn foreign_keys(cat: &Catalog, plan: &Plan) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for k in cat.constraints.values().filter(|k| k.flag == "f") {
        if let (Some(t), Some((c, p, pc))) = (cat.tables.get(&k.table), parse_fk(&k.def)) {
            out.push((t.qname(), c, p, pc));
        }
    }
    for s in &plan.after_data {
        let Some(rest) = s.strip_prefix("ALTER TABLE ") else {
            continue;
        };
        if let (Some((t, _)), Some((c, p, pc))) = (rest.split_once(" ADD CONSTRAINT "), parse_fk(s))
        {
            out.push((t.to_string(), c, p, pc));
        }
    }
    out
}

fn remap_rows(tc: &mut TableChange, col: &str, map: &BTreeMap<i64, i64>) {
    let Some(i) = tc.columns.iter().position(|c| c == col) else {
        return;
    };
    let fix = |v: &mut Option<String>| {
        if let Some(n) = v.as_deref().and_then(|s| s.parse::<i64>().ok()) {
            if let Some(m) = map.get(&n) {
                *v = Some(m.to_string());
            }
        }
    };
    for r in &mut tc.inserts {
        fix(&mut r[i]);
    }
    for (_, after, _) in &mut tc.updates {
        fix(&mut after[i]);
    }
}

/// The next `n` values `seq` would give in the target, computed from its position without
/// consuming any.
async fn next_values(side: &Side, seq: &str, n: usize) -> Result<Vec<i64>, ConnError> {
    let parse = |v: &Option<String>| v.as_deref().and_then(|s| s.parse::<i64>().ok());
    let r = side
        .rows(&format!(
            "SELECT s.last_value::pg_catalog.text, s.is_called::pg_catalog.text, q.seqincrement::pg_catalog.text \
             FROM {seq} s, pg_catalog.pg_sequence q WHERE q.seqrelid = {}::pg_catalog.regclass",
            literal(seq)
        ))
        .await?;
    let Some(r) = r.first() else {
        return Ok(Vec::new());
    };
    let (last, called, inc) = (
        parse(&r[0]).unwrap_or(0),
        matches!(r[1].as_deref(), Some("true") | Some("t")),
        parse(&r[2]).unwrap_or(1),
    );
    let first = if called { last + inc } else { last };
    Ok((0..n as i64).map(|i| first + i * inc).collect())
}

/// Take the values [`rebase`] planned from each sequence (`nextval`, once every guard has
/// passed); a sequence that moved in between is a conflict (None: all as planned).
pub async fn consume(
    side: &Side,
    taken: &[(String, Vec<i64>)],
) -> Result<Option<String>, ConnError> {
    for (seq, want) in taken {
        let rows = side
            .rows(&format!(
                "SELECT pg_catalog.nextval({})::pg_catalog.text FROM pg_catalog.generate_series(1, {})",
                literal(seq),
                want.len()
            ))
            .await?;
        let mut got: Vec<i64> = rows
            .iter()
            .filter_map(|r| r[0].as_deref()?.parse().ok())
            .collect();
        got.sort_unstable();
        if got != *want {
            return Ok(Some(format!(
                "sequence {seq}: moved in the target during the promotion (fresh keys {:?}, given {:?})",
                want.first(),
                got.first()
            )));
        }
    }
    Ok(None)
}

/// Rebase `plan` onto the target `side` reaches (see the module doc). Returns the values
/// to take from each sequence ([`consume`]) and what it did, one line per sequence.
pub async fn rebase(
    side: &Side,
    cat: &Catalog,
    plan: &mut Plan,
) -> Result<(Vec<(String, Vec<i64>)>, Vec<String>), ConnError> {
    let mut remap: Remap = BTreeMap::new();
    let mut done = Vec::new();
    let mut taken = Vec::new();
    let guarded: Vec<(String, crate::review::model::SeqState)> = plan.sequence_guards.clone();
    for (seq, golden) in guarded {
        let Some((_, after)) = plan.setvals.iter().find(|(s, _)| *s == seq).cloned() else {
            continue;
        };
        // The column whose values it generates (serial or identity).
        let owner = side
            .rows(&format!(
                "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname), \
                 pg_catalog.quote_ident(a.attname) FROM pg_catalog.pg_depend d \
                 JOIN pg_catalog.pg_class c ON c.oid = d.refobjid \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid \
                 WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass \
                 AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass \
                 AND d.objid = pg_catalog.to_regclass({}) AND d.deptype IN ('a', 'i') LIMIT 1",
                literal(&seq)
            ))
            .await?;
        let Some((table, col)) = owner
            .first()
            .and_then(|r| Some((r[0].clone()?, r[1].clone()?)))
        else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (
            golden.last_value.parse::<i64>(),
            after.last_value.parse::<i64>(),
        ) else {
            continue;
        };
        let lo = if golden.is_called { lo + 1 } else { lo };
        let Some(tc) = plan
            .tables
            .iter()
            .find(|t| t.table == table && !t.new_table)
        else {
            continue;
        };
        let Some(i) = tc.columns.iter().position(|c| *c == col) else {
            continue;
        };
        let mut generated: Vec<i64> = tc
            .inserts
            .iter()
            .filter_map(|r| r[i].as_deref()?.parse::<i64>().ok())
            .filter(|v| (lo..=hi).contains(v))
            .collect();
        if generated.is_empty() {
            continue;
        }
        generated.sort_unstable();
        let new = next_values(side, &seq, generated.len()).await?;
        if new.len() != generated.len() {
            continue;
        }
        done.push(format!(
            "{} inserted rows of {table} get fresh {col} values from {seq} ({}..{} in the scratch database, {}..{} here)",
            new.len(),
            generated[0],
            generated[generated.len() - 1],
            new[0],
            new[new.len() - 1]
        ));
        remap.insert(
            (table, col),
            generated.into_iter().zip(new.iter().copied()).collect(),
        );
        taken.push((seq.clone(), new));
        plan.sequence_guards.retain(|(s, _)| *s != seq);
        plan.setvals.retain(|(s, _)| *s != seq);
    }
    if remap.is_empty() {
        return Ok((taken, done));
    }
    let fks = foreign_keys(cat, plan);
    for ((table, col), map) in &remap {
        for tc in plan.tables.iter_mut().filter(|t| t.table == *table) {
            remap_rows(tc, col, map);
        }
        for (child, ccol, parent, pcol) in &fks {
            if parent == table && pcol == col {
                for tc in plan.tables.iter_mut().filter(|t| t.table == *child) {
                    remap_rows(tc, ccol, map);
                }
            }
        }
    }
    Ok((taken, done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_column_foreign_keys_parse() {
        assert_eq!(
            parse_fk("FOREIGN KEY (event_id) REFERENCES public.events(id) ON DELETE CASCADE"),
            Some(("event_id".into(), "public.events".into(), "id".into()))
        );
        assert_eq!(
            parse_fk(
                "ALTER TABLE public.x ADD CONSTRAINT k FOREIGN KEY (a) REFERENCES public.t(b);"
            ),
            Some(("a".into(), "public.t".into(), "b".into()))
        );
        assert_eq!(
            parse_fk("FOREIGN KEY (a, b) REFERENCES public.t(c, d)"),
            None
        );
        assert_eq!(parse_fk("CHECK (a > 0)"), None);
    }

    #[test]
    fn remapped_keys_follow_into_inserts_and_updates() {
        let mut tc = TableChange {
            table: "public.items".into(),
            new_table: false,
            dropped: false,
            multiset: false,
            columns: vec!["id".into(), "event_id".into()],
            key: vec![0],
            guard: vec![0, 1],
            recheck: vec![0, 1],
            deletes: Vec::new(),
            updates: vec![(
                vec![Some("1".into()), Some("3".into())],
                vec![Some("1".into()), Some("6".into())],
                vec![1],
            )],
            inserts: vec![vec![Some("2".into()), Some("6".into())]],
        };
        let map: BTreeMap<i64, i64> = [(6, 9)].into();
        remap_rows(&mut tc, "event_id", &map);
        assert_eq!(tc.inserts[0][1].as_deref(), Some("9"));
        assert_eq!(tc.updates[0].1[1].as_deref(), Some("9"));
        // The golden's values the guards compare are left alone.
        assert_eq!(tc.updates[0].0[1].as_deref(), Some("3"));
    }
}
