//! Schema diff: two catalog snapshots matched by OID, turned into change records and the DDL
//! of the patch. Each statement carries an order number so the patch runs dependents' drops
//! before renames, creates before data, and constraints/indexes/triggers after the data.

use std::collections::{BTreeMap, BTreeSet};

use super::catalog::{Catalog, Column, Table};
use super::conn::literal;
use super::model::{Action, SchemaChange, SequenceChange};
use super::sql::{order, q, Stmts};

mod annotations;
mod objects;
pub(super) mod relations;

/// Result of the schema diff.
#[derive(Debug, Default)]
pub struct SchemaDiff {
    /// Change records.
    pub changes: Vec<SchemaChange>,
    /// Sequence position changes.
    pub sequences: Vec<SequenceChange>,
    /// Patch statements.
    pub stmts: Stmts,
    /// Caveats.
    pub notes: Vec<String>,
    /// Objects the patch drops and creates again (catalog letter as in
    /// [`super::catalog::ObjKey`], OID): they lose their comments and privileges.
    pub recreated: BTreeSet<(char, u32)>,
}

impl SchemaDiff {
    pub(super) fn change(
        &mut self,
        kind: &str,
        action: Action,
        object: String,
        detail: String,
        before: Option<String>,
        after: Option<String>,
    ) {
        self.changes.push(SchemaChange {
            kind: kind.into(),
            action,
            object,
            detail,
            before,
            after,
            sql: Vec::new(),
        });
    }

    /// The patch statements made since `from` (a length of `stmts`) belong to the last change.
    pub(super) fn attach_since(&mut self, from: usize) {
        let made: Vec<(u32, String)> = self.stmts.get(from..).unwrap_or_default().to_vec();
        if let Some(c) = self.changes.last_mut() {
            c.sql.extend(made);
        }
    }

    pub(super) fn stmt(&mut self, order: u32, sql: String) {
        self.stmts.push((order, sql));
    }
}

/// Compare `before` (the golden) with `after` (the scratch database).
pub fn diff(before: &Catalog, after: &Catalog) -> SchemaDiff {
    let mut d = SchemaDiff::default();
    objects::schemas(before, after, &mut d);
    objects::extensions(before, after, &mut d);
    objects::types(before, after, &mut d);
    objects::functions(before, after, &mut d);
    objects::sequences(before, after, &mut d);
    tables(before, after, &mut d);
    relations::constraints(before, after, &mut d);
    relations::indexes(before, after, &mut d);
    relations::views(before, after, &mut d);
    relations::triggers(before, after, &mut d);
    annotations::comments(before, after, &mut d);
    annotations::grants(before, after, &mut d);
    d
}

/// A column default with the objects it names written by OID, so that renaming a sequence,
/// table, function or type it refers to is not a change of the default.
fn default_meaning(cat: &Catalog, expr: &str) -> String {
    let mut s = expr.to_string();
    if s.contains("::regclass") {
        let rels = cat
            .sequences
            .iter()
            .map(|(o, x)| (o, x.qname()))
            .chain(cat.tables.iter().map(|(o, t)| (o, t.qname())));
        for (oid, name) in rels {
            s = s.replace(
                &format!("{}::regclass", literal(&name)),
                &format!("#rel{oid}"),
            );
        }
    }
    // Overloaded names are left alone: the text cannot say which one is meant.
    let mut by_name: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (oid, f) in &cat.functions {
        by_name.entry(q(&f.schema, &f.name)).or_default().push(*oid);
    }
    for (name, oids) in by_name {
        if let [oid] = oids.as_slice() {
            s = s.replace(&format!("{name}("), &format!("#fn{oid}("));
        }
    }
    for (oid, t) in &cat.types {
        s = s.replace(
            &format!("::{}", q(&t.schema, &t.name)),
            &format!("::#type{oid}"),
        );
    }
    s
}

/// A table's `CREATE TABLE` as the schema diff writes it (promotion compares with it).
pub fn create_table(t: &Table) -> String {
    let cols: Vec<String> = t
        .columns
        .iter()
        .map(|c| format!("    {}", c.definition()))
        .collect();
    let unlogged = if t.persistence == "u" {
        "UNLOGGED "
    } else {
        ""
    };
    format!(
        "CREATE {unlogged}TABLE {} (\n{}\n);",
        t.qname(),
        cols.join(",\n")
    )
}

fn tables(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, t) in &a.tables {
        let name = t.qname();
        let Some(old) = b.tables.get(oid) else {
            let cols: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
            d.change(
                "table",
                Action::Added,
                name,
                format!("columns {}", cols.join(", ")),
                None,
                Some(create_table(t)),
            );
            d.stmt(order::CREATE_TABLE, create_table(t));
            if t.relkind == "p" || t.is_partition {
                d.notes.push(format!(
                    "partitioning of {} is not reproduced by the patch",
                    t.qname()
                ));
            }
            continue;
        };
        if old.schema != t.schema || old.name != t.name {
            let from = d.stmts.len();
            d.change(
                "table",
                Action::Renamed,
                name.clone(),
                format!("was {}", old.qname()),
                None,
                None,
            );
            let mut cur = old.qname();
            if old.name != t.name {
                d.stmt(
                    order::RENAME_TABLE,
                    format!("ALTER TABLE {cur} RENAME TO {};", t.name),
                );
                cur = q(&old.schema, &t.name);
            }
            if old.schema != t.schema {
                d.stmt(
                    order::RENAME_TABLE,
                    format!("ALTER TABLE {cur} SET SCHEMA {};", t.schema),
                );
            }
            d.attach_since(from);
        }
        if old.persistence != t.persistence {
            let w = if t.persistence == "u" {
                "UNLOGGED"
            } else {
                "LOGGED"
            };
            d.change(
                "table",
                Action::Altered,
                name.clone(),
                format!("set {}", w.to_lowercase()),
                None,
                None,
            );
            d.stmt(order::ALTER_COLUMN, format!("ALTER TABLE {name} SET {w};"));
            d.attach_since(d.stmts.len() - 1);
        }
        columns(&name, old, t, (b, a), d);
    }
    for (oid, t) in &b.tables {
        if !a.tables.contains_key(oid) {
            d.change(
                "table",
                Action::Dropped,
                t.qname(),
                String::new(),
                Some(create_table(t)),
                None,
            );
            d.stmt(order::DROP_TABLE, format!("DROP TABLE {};", t.qname()));
        }
    }
}

fn columns(table: &str, old: &Table, new: &Table, cats: (&Catalog, &Catalog), d: &mut SchemaDiff) {
    for c in &new.columns {
        let obj = format!("{table}.{}", c.name);
        let Some(o) = old.column(c.attnum) else {
            d.change(
                "column",
                Action::Added,
                obj,
                c.definition(),
                None,
                Some(c.definition()),
            );
            added_column(table, c, d);
            continue;
        };
        if o.name != c.name {
            d.change(
                "column",
                Action::Renamed,
                obj.clone(),
                format!("was {}", o.name),
                None,
                None,
            );
            d.stmt(
                order::RENAME_COLUMN,
                format!(
                    "ALTER TABLE {table} RENAME COLUMN {} TO {};",
                    o.name, c.name
                ),
            );
            d.attach_since(d.stmts.len() - 1);
        }
        alter_column(table, &obj, o, c, cats, d);
    }
    for o in &old.columns {
        if new.column(o.attnum).is_none() {
            d.change(
                "column",
                Action::Dropped,
                format!("{table}.{}", o.name),
                o.definition(),
                Some(o.definition()),
                None,
            );
            d.stmt(
                order::DROP_COLUMN,
                format!("ALTER TABLE {table} DROP COLUMN {};", o.name),
            );
        }
    }
}

/// An added column: created empty (a stored generated column computes itself), filled by
/// the row changes, then given its NOT NULL, default and identity, which would otherwise
/// refuse or overwrite its values.
fn added_column(table: &str, c: &Column, d: &mut SchemaDiff) {
    let col = &c.name;
    if c.generated == "s" {
        let mut add = c.clone();
        add.not_null = false;
        d.stmt(
            order::ADD_COLUMN,
            format!("ALTER TABLE {table} ADD COLUMN {};", add.definition()),
        );
    } else {
        let plain = Column {
            default: None,
            identity: String::new(),
            not_null: false,
            ..c.clone()
        };
        d.stmt(
            order::ADD_COLUMN,
            format!("ALTER TABLE {table} ADD COLUMN {};", plain.definition()),
        );
    }
    if c.not_null {
        d.stmt(
            order::SET_NOT_NULL,
            format!("ALTER TABLE {table} ALTER COLUMN {col} SET NOT NULL;"),
        );
    }
    if c.generated == "s" {
        return;
    }
    if let Some(x) = &c.default {
        d.stmt(
            order::SET_NOT_NULL,
            format!("ALTER TABLE {table} ALTER COLUMN {col} SET DEFAULT {x};"),
        );
    }
    let identity = match c.identity.as_str() {
        "a" => "ALWAYS",
        "d" => "BY DEFAULT",
        _ => return,
    };
    d.stmt(
        order::SET_NOT_NULL,
        format!("ALTER TABLE {table} ALTER COLUMN {col} ADD GENERATED {identity} AS IDENTITY;"),
    );
}

fn alter_column(
    table: &str,
    obj: &str,
    o: &Column,
    c: &Column,
    (b, a): (&Catalog, &Catalog),
    d: &mut SchemaDiff,
) {
    let mut what = Vec::new();
    let from = d.stmts.len();
    let col = &c.name;
    if o.type_name != c.type_name || o.collation != c.collation {
        what.push(format!("type {} -> {}", o.type_name, c.type_name));
        let coll = c
            .collation
            .as_ref()
            .map(|x| format!(" COLLATE {x}"))
            .unwrap_or_default();
        d.stmt(
            order::ALTER_COLUMN,
            format!(
                "ALTER TABLE {table} ALTER COLUMN {col} TYPE {}{coll} USING {col}::{};",
                c.type_name, c.type_name
            ),
        );
    }
    let meaning = |cat: &Catalog, x: &Option<String>| x.as_ref().map(|x| default_meaning(cat, x));
    if meaning(b, &o.default) != meaning(a, &c.default) && c.generated != "s" {
        what.push(format!(
            "default {} -> {}",
            o.default.as_deref().unwrap_or("none"),
            c.default.as_deref().unwrap_or("none")
        ));
        d.stmt(
            order::ALTER_COLUMN,
            match &c.default {
                Some(x) => format!("ALTER TABLE {table} ALTER COLUMN {col} SET DEFAULT {x};"),
                None => format!("ALTER TABLE {table} ALTER COLUMN {col} DROP DEFAULT;"),
            },
        );
    }
    if o.not_null != c.not_null {
        if c.not_null {
            what.push("set not null".into());
            d.stmt(
                order::SET_NOT_NULL,
                format!("ALTER TABLE {table} ALTER COLUMN {col} SET NOT NULL;"),
            );
        } else {
            what.push("drop not null".into());
            d.stmt(
                order::ALTER_COLUMN,
                format!("ALTER TABLE {table} ALTER COLUMN {col} DROP NOT NULL;"),
            );
        }
    }
    if o.identity != c.identity || o.generated != c.generated {
        what.push("identity/generation changed (not in the patch)".into());
    }
    if !what.is_empty() {
        d.change(
            "column",
            Action::Altered,
            obj.to_string(),
            what.join("; "),
            Some(o.definition()),
            Some(c.definition()),
        );
        d.attach_since(from);
    }
}
