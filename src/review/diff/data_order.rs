//! The order of the patch's row changes: a topological order over (table, change kind)
//! from the foreign keys in force while the rows change, so any re-pointing replays on
//! keys that are not deferrable. For a child table C of parent P:
//!
//! - inserts into P before inserts into C and updates of C (children may point at new
//!   parents);
//! - updates of C and deletes from C before deletes from P (children leave a parent before
//!   it goes).
//!
//! Among what is free to run, deletes come first, then updates, then inserts. A key of a
//! table on itself, or on a cycle of tables, cannot be ordered by table: it is made
//! DEFERRABLE (checked at the end of the row changes) and set back afterwards.

use std::collections::{BTreeMap, BTreeSet};

use crate::review::catalog::Catalog;
use crate::review::schema::relations::constraint_shape;
use crate::review::sql::table_name;

/// A kind of row change, in the order preferred when the keys allow any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// DELETE.
    Delete,
    /// UPDATE.
    Update,
    /// INSERT.
    Insert,
}

/// The row changes' order, and what keys it defers.
#[derive(Debug, Default)]
pub struct DataOrder {
    /// (table OID, change kind) in patch order.
    pub steps: Vec<(u32, Step)>,
    /// Before the row changes: make the keys it cannot order deferrable.
    pub before: Vec<String>,
    /// After the row changes (and their deferred checks): make them not deferrable again.
    pub after: Vec<String>,
    /// What the review should say about it.
    pub notes: Vec<String>,
}

/// Foreign keys in force while the rows change: in both catalogs with the same shape (an
/// added or changed one is created after the data), and not deferrable (those are
/// deferred by the patch). Returns (constraint OID, child, parent).
fn live_fks(old: &Catalog, new: &Catalog) -> Vec<(u32, u32, u32)> {
    new.constraints
        .iter()
        .filter(|(_, k)| k.flag == "f")
        .filter(|(oid, k)| {
            old.constraints
                .get(oid)
                .map(|o| constraint_shape(o, old) == constraint_shape(k, new))
                .unwrap_or(false)
        })
        .filter(|(_, k)| !k.def.contains(" DEFERRABLE") || k.def.contains(" NOT DEFERRABLE"))
        .filter_map(|(oid, k)| k.extra.parse::<u32>().ok().map(|p| (*oid, k.table, p)))
        .collect()
}

/// Tables reachable from `from` over child → parent edges.
fn reaches(edges: &BTreeMap<u32, BTreeSet<u32>>, from: u32, to: u32) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from];
    while let Some(t) = stack.pop() {
        if t == to {
            return true;
        }
        if seen.insert(t) {
            stack.extend(edges.get(&t).into_iter().flatten().copied());
        }
    }
    false
}

/// Parents-before-children rank of each table (for a stable, readable order).
fn depth(edges: &BTreeMap<u32, BTreeSet<u32>>, t: u32, memo: &mut BTreeMap<u32, usize>) -> usize {
    if let Some(d) = memo.get(&t) {
        return *d;
    }
    memo.insert(t, 0); // cut cycles (there are none left by the time this runs)
    let d = edges
        .get(&t)
        .into_iter()
        .flatten()
        .map(|p| depth(edges, *p, memo) + 1)
        .max()
        .unwrap_or(0);
    memo.insert(t, d);
    d
}

/// Orders the row changes of `present` (table → which kinds it has).
pub fn order(old: &Catalog, new: &Catalog, present: &BTreeMap<u32, Vec<Step>>) -> DataOrder {
    let mut out = DataOrder::default();
    let fks: Vec<(u32, u32, u32)> = live_fks(old, new)
        .into_iter()
        .filter(|(_, c, p)| present.contains_key(c) && present.contains_key(p))
        .collect();
    let mut edges: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for (_, c, p) in &fks {
        edges.entry(*c).or_default().insert(*p);
    }
    let mut acyclic: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for (oid, c, p) in &fks {
        // On a cycle: the parent reaches the child.
        if c == p || reaches(&edges, *p, *c) {
            let k = &new.constraints[oid];
            let t = table_name(new, *c);
            out.before.push(format!(
                "ALTER TABLE {t} ALTER CONSTRAINT {} DEFERRABLE INITIALLY DEFERRED;",
                k.name
            ));
            out.after.push(format!(
                "ALTER TABLE {t} ALTER CONSTRAINT {} NOT DEFERRABLE INITIALLY IMMEDIATE;",
                k.name
            ));
            out.notes.push(format!(
                "foreign key {t}.{} refers to its own table or a cycle of tables: the patch makes \
                 it DEFERRABLE while the rows change and NOT DEFERRABLE again after",
                k.name
            ));
        } else {
            acyclic.entry(*c).or_default().insert(*p);
        }
    }
    // Hard edges between (table, step) nodes.
    let mut preds: BTreeMap<(u32, Step), BTreeSet<(u32, Step)>> = BTreeMap::new();
    for (t, steps) in present {
        for s in steps {
            preds.entry((*t, *s)).or_default();
        }
    }
    let mut edge = |from: (u32, Step), to: (u32, Step)| {
        if preds.contains_key(&from) {
            if let Some(p) = preds.get_mut(&to) {
                p.insert(from);
            }
        }
    };
    for (c, ps) in &acyclic {
        for p in ps {
            edge((*p, Step::Insert), (*c, Step::Insert));
            edge((*p, Step::Insert), (*c, Step::Update));
            edge((*c, Step::Update), (*p, Step::Delete));
            edge((*c, Step::Delete), (*p, Step::Delete));
        }
    }
    let mut memo = BTreeMap::new();
    let rank = |(t, s): (u32, Step), memo: &mut BTreeMap<u32, usize>| {
        let d = depth(&acyclic, t, memo) as i64;
        // Deletes children first, the others parents first.
        (s, if s == Step::Delete { -d } else { d }, t)
    };
    // Kahn's algorithm, always taking the most preferred free node.
    while !preds.is_empty() {
        let free: Vec<(u32, Step)> = preds
            .iter()
            .filter(|(_, p)| p.is_empty())
            .map(|(n, _)| *n)
            .collect();
        let Some(next) = free.into_iter().min_by_key(|n| rank(*n, &mut memo)) else {
            // Unreachable (the edges are acyclic); keep every change rather than lose one.
            let rest: Vec<(u32, Step)> = preds.keys().copied().collect();
            out.steps.extend(rest);
            break;
        };
        preds.remove(&next);
        for p in preds.values_mut() {
            p.remove(&next);
        }
        out.steps.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::catalog::{Object, Table};

    fn table(name: &str) -> Table {
        Table {
            schema: "public".into(),
            name: name.into(),
            relkind: "r".into(),
            relfilenode: String::new(),
            persistence: "p".into(),
            is_partition: false,
            columns: Vec::new(),
            counters: [0; 4],
        }
    }

    /// Tables 1..=n, and foreign keys (constraint OID, child, parent, definition).
    fn catalog(n: u32, fks: &[(u32, u32, u32, &str)]) -> Catalog {
        let mut c = Catalog::default();
        for t in 1..=n {
            c.tables.insert(t, table(&format!("t{t}")));
        }
        for (oid, child, parent, def) in fks {
            c.constraints.insert(
                *oid,
                Object {
                    table: *child,
                    schema: "public".into(),
                    name: format!("fk{oid}"),
                    def: def.to_string(),
                    flag: "f".into(),
                    extra: parent.to_string(),
                },
            );
        }
        c
    }

    const ALL: [Step; 3] = [Step::Delete, Step::Update, Step::Insert];

    #[test]
    fn re_pointing_children_orders_parent_inserts_before_and_parent_deletes_after() {
        // t2 -> t1.
        let c = catalog(2, &[(10, 2, 1, "FOREIGN KEY (p) REFERENCES public.t1(id)")]);
        let present = BTreeMap::from([(1, ALL.to_vec()), (2, ALL.to_vec())]);
        let o = order(&c, &c, &present);
        let at = |n: (u32, Step)| o.steps.iter().position(|s| *s == n).expect("step");
        assert!(at((1, Step::Insert)) < at((2, Step::Update)));
        assert!(at((1, Step::Insert)) < at((2, Step::Insert)));
        assert!(at((2, Step::Update)) < at((1, Step::Delete)));
        assert!(at((2, Step::Delete)) < at((1, Step::Delete)));
        assert_eq!(o.steps.len(), 6);
        assert!(o.before.is_empty() && o.notes.is_empty());
    }

    #[test]
    fn self_references_and_cycles_are_deferred_and_deferrable_keys_ignored() {
        let c = catalog(
            4,
            &[
                (10, 1, 1, "FOREIGN KEY (p) REFERENCES public.t1(id)"),
                (11, 2, 3, "FOREIGN KEY (p) REFERENCES public.t3(id)"),
                (12, 3, 2, "FOREIGN KEY (p) REFERENCES public.t2(id)"),
                (
                    13,
                    4,
                    1,
                    "FOREIGN KEY (p) REFERENCES public.t1(id) DEFERRABLE",
                ),
            ],
        );
        let present: BTreeMap<u32, Vec<Step>> = (1..=4).map(|t| (t, ALL.to_vec())).collect();
        let o = order(&c, &c, &present);
        assert_eq!(o.steps.len(), 12);
        assert_eq!(o.before.len(), 3, "{:?}", o.before);
        assert!(o.before[0].contains("ALTER CONSTRAINT fk10 DEFERRABLE"));
        assert!(o.after[0].contains("ALTER CONSTRAINT fk10 NOT DEFERRABLE"));
        assert_eq!(o.notes.len(), 3);
    }

    #[test]
    fn keys_added_by_the_agent_do_not_order_the_rows() {
        let old = catalog(2, &[]);
        let new = catalog(2, &[(10, 1, 2, "FOREIGN KEY (p) REFERENCES public.t2(id)")]);
        let present = BTreeMap::from([(1, vec![Step::Insert]), (2, vec![Step::Delete])]);
        let o = order(&old, &new, &present);
        // No edge: deletes first, as preferred.
        assert_eq!(o.steps, vec![(2, Step::Delete), (1, Step::Insert)]);
    }
}
