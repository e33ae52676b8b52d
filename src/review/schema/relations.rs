//! Schema diff of what hangs off tables: constraints, indexes, views, triggers (matched by
//! OID; a definition change becomes drop + create, a pure rename a RENAME).

use super::SchemaDiff;
use crate::review::catalog::{Catalog, Object};
use crate::review::model::Action;
use crate::review::sql::{order, q, table_name};

/// A constraint's definition with the table it references (FK) written as `_`, so that
/// renaming that table is not a change of the constraint.
pub(in crate::review) fn constraint_shape(k: &Object, cat: &Catalog) -> String {
    match k.extra.parse::<u32>() {
        Ok(target) if k.flag == "f" && target != 0 => k.def.replacen(
            &format!("REFERENCES {}(", table_name(cat, target)),
            "REFERENCES _(",
            1,
        ),
        _ => k.def.clone(),
    }
}

/// A trigger's definition with its own name and table written as `_`.
pub(in crate::review) fn trigger_shape(t: &Object, cat: &Catalog) -> String {
    t.def
        .replacen(&format!("TRIGGER {} ", t.name), "TRIGGER _ ", 1)
        .replacen(&format!(" ON {} ", table_name(cat, t.table)), " ON _ ", 1)
}

pub(super) fn constraints(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    let add_order = |k: &Object| {
        if k.flag == "f" {
            order::ADD_FK
        } else {
            order::ADD_CONSTRAINT
        }
    };
    let drop_order = |k: &Object| {
        if k.flag == "f" {
            order::DROP_FK
        } else {
            order::DROP_CONSTRAINT
        }
    };
    for (oid, k) in &a.constraints {
        let t = table_name(a, k.table);
        let obj = format!("{t}.{}", k.name);
        let add = format!("ALTER TABLE {t} ADD CONSTRAINT {} {};", k.name, k.def);
        match b.constraints.get(oid) {
            None => {
                d.change(
                    "constraint",
                    Action::Added,
                    obj,
                    k.def.clone(),
                    None,
                    Some(k.def.clone()),
                );
                d.stmt(add_order(k), add);
            }
            Some(old) if constraint_shape(old, b) != constraint_shape(k, a) => {
                d.change(
                    "constraint",
                    Action::Altered,
                    obj,
                    "definition changed".into(),
                    Some(old.def.clone()),
                    Some(k.def.clone()),
                );
                d.recreated.insert(('k', *oid));
                d.stmt(
                    drop_order(old),
                    format!(
                        "ALTER TABLE {} DROP CONSTRAINT {};",
                        table_name(b, old.table),
                        old.name
                    ),
                );
                d.stmt(add_order(k), add);
                d.attach_since(d.stmts.len() - 2);
            }
            Some(old) if old.name != k.name => {
                d.change(
                    "constraint",
                    Action::Renamed,
                    obj,
                    format!("was {}", old.name),
                    None,
                    None,
                );
                d.stmt(
                    order::RENAME_OTHER,
                    format!(
                        "ALTER TABLE {t} RENAME CONSTRAINT {} TO {};",
                        old.name, k.name
                    ),
                );
                d.attach_since(d.stmts.len() - 1);
            }
            _ => {}
        }
    }
    for (oid, k) in &b.constraints {
        // Constraints of dropped tables go with their table.
        if !a.constraints.contains_key(oid) && a.tables.contains_key(&k.table) {
            let t = table_name(b, k.table);
            d.change(
                "constraint",
                Action::Dropped,
                format!("{t}.{}", k.name),
                k.def.clone(),
                Some(k.def.clone()),
                None,
            );
            d.stmt(
                drop_order(k),
                format!("ALTER TABLE {t} DROP CONSTRAINT {};", k.name),
            );
        }
    }
}

fn index_shape(i: &Object, cat: &Catalog) -> String {
    let t = table_name(cat, i.table);
    i.def
        .replacen(&format!("INDEX {} ON ", i.name), "INDEX _ ON ", 1)
        .replacen(&format!(" ON ONLY {t} "), " ON ONLY _ ", 1)
        .replacen(&format!(" ON {t} "), " ON _ ", 1)
}

pub(super) fn indexes(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, i) in a.indexes.iter().filter(|(_, i)| i.flag != "c") {
        let obj = q(&i.schema, &i.name);
        match b.indexes.get(oid) {
            None => {
                d.change(
                    "index",
                    Action::Added,
                    obj,
                    i.def.clone(),
                    None,
                    Some(i.def.clone()),
                );
                d.stmt(order::CREATE_INDEX, format!("{};", i.def));
            }
            Some(old) if index_shape(old, b) != index_shape(i, a) => {
                d.change(
                    "index",
                    Action::Altered,
                    obj,
                    "definition changed".into(),
                    Some(old.def.clone()),
                    Some(i.def.clone()),
                );
                d.recreated.insert(('c', *oid));
                d.stmt(
                    order::DROP_INDEX,
                    format!("DROP INDEX {};", q(&old.schema, &old.name)),
                );
                d.stmt(order::CREATE_INDEX, format!("{};", i.def));
                d.attach_since(d.stmts.len() - 2);
            }
            Some(old) if old.name != i.name => {
                d.change(
                    "index",
                    Action::Renamed,
                    obj,
                    format!("was {}", old.name),
                    None,
                    None,
                );
                d.stmt(
                    order::RENAME_OTHER,
                    format!(
                        "ALTER INDEX {} RENAME TO {};",
                        q(&i.schema, &old.name),
                        i.name
                    ),
                );
                d.attach_since(d.stmts.len() - 1);
            }
            _ => {}
        }
    }
    for (oid, i) in b.indexes.iter().filter(|(_, i)| i.flag != "c") {
        if !a.indexes.contains_key(oid) && a.tables.contains_key(&i.table) {
            d.change(
                "index",
                Action::Dropped,
                q(&i.schema, &i.name),
                i.def.clone(),
                Some(i.def.clone()),
                None,
            );
            d.stmt(
                order::DROP_INDEX,
                format!("DROP INDEX {};", q(&i.schema, &i.name)),
            );
        }
    }
}

fn view_sql(v: &Object) -> String {
    let w = if v.flag == "m" {
        "MATERIALIZED VIEW"
    } else {
        "VIEW"
    };
    format!(
        "CREATE {w} {} AS\n{};",
        q(&v.schema, &v.name),
        v.def.trim().trim_end_matches(';')
    )
}

pub(super) fn views(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    let drop = |v: &Object| {
        let w = if v.flag == "m" {
            "MATERIALIZED VIEW"
        } else {
            "VIEW"
        };
        format!("DROP {w} {};", q(&v.schema, &v.name))
    };
    for (oid, v) in &a.views {
        let obj = q(&v.schema, &v.name);
        match b.views.get(oid) {
            None => {
                d.change(
                    "view",
                    Action::Added,
                    obj,
                    String::new(),
                    None,
                    Some(v.def.clone()),
                );
                d.stmt(order::CREATE_VIEW, view_sql(v));
                d.attach_since(d.stmts.len() - 1);
            }
            Some(old) if old != v => {
                let (action, detail) = if old.def == v.def && old.flag == v.flag {
                    (
                        Action::Renamed,
                        format!("was {}", q(&old.schema, &old.name)),
                    )
                } else {
                    (Action::Altered, "definition changed".to_string())
                };
                d.change(
                    "view",
                    action,
                    obj,
                    detail,
                    Some(old.def.clone()),
                    Some(v.def.clone()),
                );
                d.recreated.insert(('c', *oid));
                d.stmt(order::DROP_VIEW, drop(old));
                d.stmt(order::CREATE_VIEW, view_sql(v));
                d.attach_since(d.stmts.len() - 2);
            }
            _ => {}
        }
    }
    for (oid, v) in &b.views {
        if !a.views.contains_key(oid) {
            d.change(
                "view",
                Action::Dropped,
                q(&v.schema, &v.name),
                String::new(),
                Some(v.def.clone()),
                None,
            );
            d.stmt(order::DROP_VIEW, drop(v));
            d.attach_since(d.stmts.len() - 1);
        }
    }
}

pub(super) fn triggers(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, t) in &a.triggers {
        let obj = format!("{}.{}", table_name(a, t.table), t.name);
        match b.triggers.get(oid) {
            None => {
                d.change(
                    "trigger",
                    Action::Added,
                    obj,
                    t.def.clone(),
                    None,
                    Some(t.def.clone()),
                );
                d.stmt(order::CREATE_TRIGGER, format!("{};", t.def));
            }
            Some(old) if trigger_shape(old, b) != trigger_shape(t, a) => {
                d.change(
                    "trigger",
                    Action::Altered,
                    obj,
                    "definition changed".into(),
                    Some(old.def.clone()),
                    Some(t.def.clone()),
                );
                d.recreated.insert(('g', *oid));
                d.stmt(
                    order::DROP_TRIGGER,
                    format!("DROP TRIGGER {} ON {};", old.name, table_name(b, old.table)),
                );
                d.stmt(order::CREATE_TRIGGER, format!("{};", t.def));
            }
            Some(old) if old.name != t.name => {
                d.change(
                    "trigger",
                    Action::Renamed,
                    obj,
                    format!("was {}", old.name),
                    None,
                    None,
                );
                d.stmt(
                    order::RENAME_OTHER,
                    format!(
                        "ALTER TRIGGER {} ON {} RENAME TO {};",
                        old.name,
                        table_name(a, t.table),
                        t.name
                    ),
                );
                d.attach_since(d.stmts.len() - 1);
            }
            _ => {}
        }
    }
    for (oid, t) in &b.triggers {
        if !a.triggers.contains_key(oid) && a.tables.contains_key(&t.table) {
            let tn = table_name(b, t.table);
            d.change(
                "trigger",
                Action::Dropped,
                format!("{tn}.{}", t.name),
                t.def.clone(),
                Some(t.def.clone()),
                None,
            );
            d.stmt(
                order::DROP_TRIGGER,
                format!("DROP TRIGGER {} ON {tn};", t.name),
            );
            d.attach_since(d.stmts.len() - 1);
        }
    }
}
