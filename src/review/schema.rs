//! Schema diff: two catalog snapshots matched by OID, turned into change records and the DDL
//! of the patch. Each statement carries an order number so the patch runs dependents' drops
//! before renames, creates before data, and constraints/indexes/triggers after the data.

use super::catalog::{Catalog, Column, Object, Table};
use super::conn::literal;
use super::model::{Action, SchemaChange, SeqState, SequenceChange};

/// Patch statements with their place in the patch (see [`order`]).
pub type Stmts = Vec<(u32, String)>;

/// Order numbers: below [`order::DATA`] runs before the row changes, above it after.
pub mod order {
    /// CREATE SCHEMA.
    pub const CREATE_SCHEMA: u32 = 1;
    /// ALTER SCHEMA … RENAME.
    pub const RENAME_SCHEMA: u32 = 2;
    /// CREATE / ALTER EXTENSION.
    pub const EXTENSION: u32 = 3;
    /// ALTER FUNCTION … RENAME.
    pub const RENAME_FUNCTION: u32 = 4;
    /// CREATE OR REPLACE FUNCTION.
    pub const FUNCTION: u32 = 5;
    /// CREATE SEQUENCE.
    pub const CREATE_SEQUENCE: u32 = 6;
    /// DROP VIEW.
    pub const DROP_VIEW: u32 = 10;
    /// DROP TRIGGER.
    pub const DROP_TRIGGER: u32 = 11;
    /// DROP foreign keys.
    pub const DROP_FK: u32 = 13;
    /// DROP other constraints.
    pub const DROP_CONSTRAINT: u32 = 14;
    /// DROP INDEX.
    pub const DROP_INDEX: u32 = 15;
    /// Table rename / set schema.
    pub const RENAME_TABLE: u32 = 20;
    /// Column rename.
    pub const RENAME_COLUMN: u32 = 21;
    /// DROP COLUMN.
    pub const DROP_COLUMN: u32 = 22;
    /// DROP TABLE.
    pub const DROP_TABLE: u32 = 23;
    /// CREATE TABLE.
    pub const CREATE_TABLE: u32 = 24;
    /// ADD COLUMN.
    pub const ADD_COLUMN: u32 = 25;
    /// ALTER COLUMN type / default / DROP NOT NULL.
    pub const ALTER_COLUMN: u32 = 26;
    /// Constraint, index, sequence renames.
    pub const RENAME_OTHER: u32 = 27;
    /// ALTER SEQUENCE parameters.
    pub const ALTER_SEQUENCE: u32 = 30;
    /// DROP SEQUENCE.
    pub const DROP_SEQUENCE: u32 = 87;
    /// DROP FUNCTION.
    pub const DROP_FUNCTION: u32 = 88;
    /// DROP EXTENSION.
    pub const DROP_EXTENSION: u32 = 89;
    /// DROP SCHEMA.
    pub const DROP_SCHEMA: u32 = 90;
    /// Row changes go here.
    pub const DATA: u32 = 99;
    /// SET NOT NULL.
    pub const SET_NOT_NULL: u32 = 100;
    /// ADD CONSTRAINT (not FK).
    pub const ADD_CONSTRAINT: u32 = 101;
    /// ADD CONSTRAINT … FOREIGN KEY.
    pub const ADD_FK: u32 = 102;
    /// CREATE INDEX.
    pub const CREATE_INDEX: u32 = 103;
    /// CREATE VIEW.
    pub const CREATE_VIEW: u32 = 104;
    /// CREATE TRIGGER.
    pub const CREATE_TRIGGER: u32 = 105;
    /// ALTER SEQUENCE … OWNED BY.
    pub const OWNED_BY: u32 = 106;
    /// setval.
    pub const SETVAL: u32 = 107;
}

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
}

impl SchemaDiff {
    fn change(
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
        });
    }

    fn stmt(&mut self, order: u32, sql: String) {
        self.stmts.push((order, sql));
    }
}

fn q(schema: &str, name: &str) -> String {
    format!("{schema}.{name}")
}

/// Compare `before` (the golden) with `after` (the scratch database).
pub fn diff(before: &Catalog, after: &Catalog) -> SchemaDiff {
    let mut d = SchemaDiff::default();
    schemas(before, after, &mut d);
    extensions(before, after, &mut d);
    functions(before, after, &mut d);
    sequences(before, after, &mut d);
    tables(before, after, &mut d);
    constraints(before, after, &mut d);
    indexes(before, after, &mut d);
    views(before, after, &mut d);
    triggers(before, after, &mut d);
    d
}

fn schemas(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, name) in &a.schemas {
        match b.schemas.get(oid) {
            None => {
                d.change("schema", Action::Added, name.clone(), String::new(), None, None);
                d.stmt(order::CREATE_SCHEMA, format!("CREATE SCHEMA {name};"));
            }
            Some(old) if old != name => {
                d.change("schema", Action::Renamed, name.clone(), format!("was {old}"), None, None);
                d.stmt(order::RENAME_SCHEMA, format!("ALTER SCHEMA {old} RENAME TO {name};"));
            }
            _ => {}
        }
    }
    for (oid, name) in &b.schemas {
        if !a.schemas.contains_key(oid) {
            d.change("schema", Action::Dropped, name.clone(), String::new(), None, None);
            d.stmt(order::DROP_SCHEMA, format!("DROP SCHEMA {name};"));
        }
    }
}

fn extensions(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, (name, schema, version)) in &a.extensions {
        match b.extensions.get(oid) {
            None => {
                d.change("extension", Action::Added, name.clone(), format!("version {version}"), None, None);
                d.stmt(
                    order::EXTENSION,
                    format!(
                        "CREATE EXTENSION IF NOT EXISTS {name} WITH SCHEMA {schema} VERSION {};",
                        literal(version)
                    ),
                );
            }
            Some((_, _, v)) if v != version => {
                d.change("extension", Action::Altered, name.clone(), format!("version {v} -> {version}"), None, None);
                d.stmt(order::EXTENSION, format!("ALTER EXTENSION {name} UPDATE TO {};", literal(version)));
            }
            _ => {}
        }
    }
    for (oid, (name, _, _)) in &b.extensions {
        if !a.extensions.contains_key(oid) {
            d.change("extension", Action::Dropped, name.clone(), String::new(), None, None);
            d.stmt(order::DROP_EXTENSION, format!("DROP EXTENSION {name};"));
        }
    }
}

fn function_word(f: &Object) -> &'static str {
    if f.flag == "p" {
        "PROCEDURE"
    } else if f.flag == "a" {
        "AGGREGATE"
    } else {
        "FUNCTION"
    }
}

fn functions(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, f) in &a.functions {
        let sig = format!("{}({})", q(&f.schema, &f.name), f.extra);
        match b.functions.get(oid) {
            None => {
                d.change("function", Action::Added, sig, String::new(), None, Some(f.def.clone()));
                if f.flag == "a" {
                    d.notes.push(format!("aggregate {} is not reproduced by the patch", f.name));
                } else {
                    d.stmt(order::FUNCTION, format!("{};", f.def.trim_end()));
                }
            }
            Some(old) => {
                let renamed = old.name != f.name || old.schema != f.schema;
                let norm = |o: &Object| o.def.replacen(&format!("{}(", q(&o.schema, &o.name)), "_(", 1);
                let changed = norm(old) != norm(f);
                if renamed {
                    d.change("function", Action::Renamed, sig.clone(), format!("was {}({})", q(&old.schema, &old.name), old.extra), None, None);
                    let w = function_word(f);
                    let mut cur = q(&old.schema, &old.name);
                    if old.name != f.name {
                        d.stmt(order::RENAME_FUNCTION, format!("ALTER {w} {cur}({}) RENAME TO {};", old.extra, f.name));
                        cur = q(&old.schema, &f.name);
                    }
                    if old.schema != f.schema {
                        d.stmt(order::RENAME_FUNCTION, format!("ALTER {w} {cur}({}) SET SCHEMA {};", old.extra, f.schema));
                    }
                }
                if changed {
                    d.change("function", Action::Altered, sig, "definition changed".into(), Some(old.def.clone()), Some(f.def.clone()));
                    if f.flag != "a" {
                        d.stmt(order::FUNCTION, format!("{};", f.def.trim_end()));
                    }
                }
            }
        }
    }
    for (oid, f) in &b.functions {
        if !a.functions.contains_key(oid) {
            let sig = format!("{}({})", q(&f.schema, &f.name), f.extra);
            d.change("function", Action::Dropped, sig.clone(), String::new(), Some(f.def.clone()), None);
            d.stmt(order::DROP_FUNCTION, format!("DROP {} {sig};", function_word(f)));
        }
    }
}

fn sequences(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, s) in &a.sequences {
        let name = s.qname();
        let old = b.sequences.get(oid);
        match old {
            None => {
                d.change("sequence", Action::Added, name.clone(), s.params.clone(), None, None);
                if !s.identity {
                    d.stmt(order::CREATE_SEQUENCE, format!("CREATE SEQUENCE {name} {};", s.params));
                    if let Some(o) = &s.owned_by {
                        d.stmt(order::OWNED_BY, format!("ALTER SEQUENCE {name} OWNED BY {o};"));
                    }
                }
            }
            Some(old) => {
                if old.name != s.name || old.schema != s.schema {
                    d.change("sequence", Action::Renamed, name.clone(), format!("was {}", old.qname()), None, None);
                    if !s.identity {
                        let mut cur = old.qname();
                        if old.name != s.name {
                            d.stmt(order::RENAME_OTHER, format!("ALTER SEQUENCE {cur} RENAME TO {};", s.name));
                            cur = q(&old.schema, &s.name);
                        }
                        if old.schema != s.schema {
                            d.stmt(order::RENAME_OTHER, format!("ALTER SEQUENCE {cur} SET SCHEMA {};", s.schema));
                        }
                    }
                }
                if old.params != s.params {
                    d.change("sequence", Action::Altered, name.clone(), format!("{} -> {}", old.params, s.params), None, None);
                    d.stmt(order::ALTER_SEQUENCE, format!("ALTER SEQUENCE {name} {};", s.params));
                }
            }
        }
        let before = old.and_then(|o| o.state.clone());
        if let Some((v, called)) = &s.state {
            let fresh_default = old.is_none() && !called;
            if before.as_ref() != Some(&(v.clone(), *called)) && !fresh_default {
                d.sequences.push(SequenceChange {
                    sequence: name.clone(),
                    before: before.map(|(v, c)| SeqState { last_value: v, is_called: c }),
                    after: SeqState { last_value: v.clone(), is_called: *called },
                });
                d.stmt(order::SETVAL, format!("SELECT pg_catalog.setval({}, {v}, {called});", literal(&name)));
            }
        }
    }
    for (oid, s) in &b.sequences {
        if !a.sequences.contains_key(oid) {
            d.change("sequence", Action::Dropped, s.qname(), String::new(), None, None);
            if !s.identity && s.owned_by.is_none() {
                d.stmt(order::DROP_SEQUENCE, format!("DROP SEQUENCE {};", s.qname()));
            }
        }
    }
    if let Some(e) = a.sequence_error.as_ref().or(b.sequence_error.as_ref()) {
        d.notes.push(format!("sequence positions could not be read: {e}"));
    }
}

fn create_table(t: &Table) -> String {
    let cols: Vec<String> = t.columns.iter().map(|c| format!("    {}", c.definition())).collect();
    let unlogged = if t.persistence == "u" { "UNLOGGED " } else { "" };
    format!("CREATE {unlogged}TABLE {} (\n{}\n);", t.qname(), cols.join(",\n"))
}

fn tables(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, t) in &a.tables {
        let name = t.qname();
        let Some(old) = b.tables.get(oid) else {
            let cols: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
            d.change("table", Action::Added, name, format!("columns {}", cols.join(", ")), None, Some(create_table(t)));
            d.stmt(order::CREATE_TABLE, create_table(t));
            if t.relkind == "p" || t.is_partition {
                d.notes.push(format!("partitioning of {} is not reproduced by the patch", t.qname()));
            }
            continue;
        };
        if old.schema != t.schema || old.name != t.name {
            d.change("table", Action::Renamed, name.clone(), format!("was {}", old.qname()), None, None);
            let mut cur = old.qname();
            if old.name != t.name {
                d.stmt(order::RENAME_TABLE, format!("ALTER TABLE {cur} RENAME TO {};", t.name));
                cur = q(&old.schema, &t.name);
            }
            if old.schema != t.schema {
                d.stmt(order::RENAME_TABLE, format!("ALTER TABLE {cur} SET SCHEMA {};", t.schema));
            }
        }
        if old.persistence != t.persistence {
            let w = if t.persistence == "u" { "UNLOGGED" } else { "LOGGED" };
            d.change("table", Action::Altered, name.clone(), format!("set {}", w.to_lowercase()), None, None);
            d.stmt(order::ALTER_COLUMN, format!("ALTER TABLE {name} SET {w};"));
        }
        columns(&name, old, t, d);
    }
    for (oid, t) in &b.tables {
        if !a.tables.contains_key(oid) {
            d.change("table", Action::Dropped, t.qname(), String::new(), Some(create_table(t)), None);
            d.stmt(order::DROP_TABLE, format!("DROP TABLE {};", t.qname()));
        }
    }
}

fn columns(table: &str, old: &Table, new: &Table, d: &mut SchemaDiff) {
    for c in &new.columns {
        let obj = format!("{table}.{}", c.name);
        let Some(o) = old.column(c.attnum) else {
            d.change("column", Action::Added, obj, c.definition(), None, Some(c.definition()));
            let mut add = c.clone();
            add.not_null = false;
            d.stmt(order::ADD_COLUMN, format!("ALTER TABLE {table} ADD COLUMN {};", add.definition()));
            if c.not_null {
                d.stmt(order::SET_NOT_NULL, format!("ALTER TABLE {table} ALTER COLUMN {} SET NOT NULL;", c.name));
            }
            continue;
        };
        if o.name != c.name {
            d.change("column", Action::Renamed, obj.clone(), format!("was {}", o.name), None, None);
            d.stmt(order::RENAME_COLUMN, format!("ALTER TABLE {table} RENAME COLUMN {} TO {};", o.name, c.name));
        }
        alter_column(table, &obj, o, c, d);
    }
    for o in &old.columns {
        if new.column(o.attnum).is_none() {
            d.change("column", Action::Dropped, format!("{table}.{}", o.name), o.definition(), Some(o.definition()), None);
            d.stmt(order::DROP_COLUMN, format!("ALTER TABLE {table} DROP COLUMN {};", o.name));
        }
    }
}

fn alter_column(table: &str, obj: &str, o: &Column, c: &Column, d: &mut SchemaDiff) {
    let mut what = Vec::new();
    let col = &c.name;
    if o.type_name != c.type_name || o.collation != c.collation {
        what.push(format!("type {} -> {}", o.type_name, c.type_name));
        let coll = c.collation.as_ref().map(|x| format!(" COLLATE {x}")).unwrap_or_default();
        d.stmt(
            order::ALTER_COLUMN,
            format!("ALTER TABLE {table} ALTER COLUMN {col} TYPE {}{coll} USING {col}::{};", c.type_name, c.type_name),
        );
    }
    if o.default != c.default && c.generated != "s" {
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
            d.stmt(order::SET_NOT_NULL, format!("ALTER TABLE {table} ALTER COLUMN {col} SET NOT NULL;"));
        } else {
            what.push("drop not null".into());
            d.stmt(order::ALTER_COLUMN, format!("ALTER TABLE {table} ALTER COLUMN {col} DROP NOT NULL;"));
        }
    }
    if o.identity != c.identity || o.generated != c.generated {
        what.push("identity/generation changed (not in the patch)".into());
    }
    if !what.is_empty() {
        d.change("column", Action::Altered, obj.to_string(), what.join("; "), Some(o.definition()), Some(c.definition()));
    }
}

fn table_name(cat: &Catalog, oid: u32) -> String {
    cat.tables.get(&oid).map(Table::qname).unwrap_or_else(|| format!("<table {oid}>"))
}

fn constraints(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    let add_order = |k: &Object| if k.flag == "f" { order::ADD_FK } else { order::ADD_CONSTRAINT };
    let drop_order = |k: &Object| if k.flag == "f" { order::DROP_FK } else { order::DROP_CONSTRAINT };
    for (oid, k) in &a.constraints {
        let t = table_name(a, k.table);
        let obj = format!("{t}.{}", k.name);
        let add = format!("ALTER TABLE {t} ADD CONSTRAINT {} {};", k.name, k.def);
        match b.constraints.get(oid) {
            None => {
                d.change("constraint", Action::Added, obj, k.def.clone(), None, Some(k.def.clone()));
                d.stmt(add_order(k), add);
            }
            Some(old) if old.def != k.def => {
                d.change("constraint", Action::Altered, obj, "definition changed".into(), Some(old.def.clone()), Some(k.def.clone()));
                d.stmt(drop_order(old), format!("ALTER TABLE {} DROP CONSTRAINT {};", table_name(b, old.table), old.name));
                d.stmt(add_order(k), add);
            }
            Some(old) if old.name != k.name => {
                d.change("constraint", Action::Renamed, obj, format!("was {}", old.name), None, None);
                d.stmt(order::RENAME_OTHER, format!("ALTER TABLE {t} RENAME CONSTRAINT {} TO {};", old.name, k.name));
            }
            _ => {}
        }
    }
    for (oid, k) in &b.constraints {
        // Constraints of dropped tables go with their table.
        if !a.constraints.contains_key(oid) && a.tables.contains_key(&k.table) {
            let t = table_name(b, k.table);
            d.change("constraint", Action::Dropped, format!("{t}.{}", k.name), k.def.clone(), Some(k.def.clone()), None);
            d.stmt(drop_order(k), format!("ALTER TABLE {t} DROP CONSTRAINT {};", k.name));
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

fn indexes(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, i) in a.indexes.iter().filter(|(_, i)| i.flag != "c") {
        let obj = q(&i.schema, &i.name);
        match b.indexes.get(oid) {
            None => {
                d.change("index", Action::Added, obj, i.def.clone(), None, Some(i.def.clone()));
                d.stmt(order::CREATE_INDEX, format!("{};", i.def));
            }
            Some(old) if index_shape(old, b) != index_shape(i, a) => {
                d.change("index", Action::Altered, obj, "definition changed".into(), Some(old.def.clone()), Some(i.def.clone()));
                d.stmt(order::DROP_INDEX, format!("DROP INDEX {};", q(&old.schema, &old.name)));
                d.stmt(order::CREATE_INDEX, format!("{};", i.def));
            }
            Some(old) if old.name != i.name => {
                d.change("index", Action::Renamed, obj, format!("was {}", old.name), None, None);
                d.stmt(order::RENAME_OTHER, format!("ALTER INDEX {} RENAME TO {};", q(&i.schema, &old.name), i.name));
            }
            _ => {}
        }
    }
    for (oid, i) in b.indexes.iter().filter(|(_, i)| i.flag != "c") {
        if !a.indexes.contains_key(oid) && a.tables.contains_key(&i.table) {
            d.change("index", Action::Dropped, q(&i.schema, &i.name), i.def.clone(), Some(i.def.clone()), None);
            d.stmt(order::DROP_INDEX, format!("DROP INDEX {};", q(&i.schema, &i.name)));
        }
    }
}

fn view_sql(v: &Object) -> String {
    let w = if v.flag == "m" { "MATERIALIZED VIEW" } else { "VIEW" };
    format!("CREATE {w} {} AS\n{};", q(&v.schema, &v.name), v.def.trim().trim_end_matches(';'))
}

fn views(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    let drop = |v: &Object| {
        let w = if v.flag == "m" { "MATERIALIZED VIEW" } else { "VIEW" };
        format!("DROP {w} {};", q(&v.schema, &v.name))
    };
    for (oid, v) in &a.views {
        let obj = q(&v.schema, &v.name);
        match b.views.get(oid) {
            None => {
                d.change("view", Action::Added, obj, String::new(), None, Some(v.def.clone()));
                d.stmt(order::CREATE_VIEW, view_sql(v));
            }
            Some(old) if old != v => {
                let (action, detail) = if old.def == v.def && old.flag == v.flag {
                    (Action::Renamed, format!("was {}", q(&old.schema, &old.name)))
                } else {
                    (Action::Altered, "definition changed".to_string())
                };
                d.change("view", action, obj, detail, Some(old.def.clone()), Some(v.def.clone()));
                d.stmt(order::DROP_VIEW, drop(old));
                d.stmt(order::CREATE_VIEW, view_sql(v));
            }
            _ => {}
        }
    }
    for (oid, v) in &b.views {
        if !a.views.contains_key(oid) {
            d.change("view", Action::Dropped, q(&v.schema, &v.name), String::new(), Some(v.def.clone()), None);
            d.stmt(order::DROP_VIEW, drop(v));
        }
    }
}

fn triggers(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, t) in &a.triggers {
        let obj = format!("{}.{}", table_name(a, t.table), t.name);
        match b.triggers.get(oid) {
            None => {
                d.change("trigger", Action::Added, obj, t.def.clone(), None, Some(t.def.clone()));
                d.stmt(order::CREATE_TRIGGER, format!("{};", t.def));
            }
            Some(old) if old.def != t.def => {
                d.change("trigger", Action::Altered, obj, "definition changed".into(), Some(old.def.clone()), Some(t.def.clone()));
                d.stmt(order::DROP_TRIGGER, format!("DROP TRIGGER {} ON {};", old.name, table_name(b, old.table)));
                d.stmt(order::CREATE_TRIGGER, format!("{};", t.def));
            }
            _ => {}
        }
    }
    for (oid, t) in &b.triggers {
        if !a.triggers.contains_key(oid) && a.tables.contains_key(&t.table) {
            let tn = table_name(b, t.table);
            d.change("trigger", Action::Dropped, format!("{tn}.{}", t.name), t.def.clone(), Some(t.def.clone()), None);
            d.stmt(order::DROP_TRIGGER, format!("DROP TRIGGER {} ON {tn};", t.name));
        }
    }
}
