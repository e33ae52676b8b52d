//! Schema diff of schemas, extensions, types, functions and sequences (matched by OID).

use super::SchemaDiff;
use crate::review::catalog::{Catalog, Object};
use crate::review::conn::literal;
use crate::review::model::{Action, SeqState, SequenceChange};
use crate::review::sql::{order, q};

pub(super) fn schemas(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, name) in &a.schemas {
        match b.schemas.get(oid) {
            None => {
                d.change(
                    "schema",
                    Action::Added,
                    name.clone(),
                    String::new(),
                    None,
                    None,
                );
                d.stmt(order::CREATE_SCHEMA, format!("CREATE SCHEMA {name};"));
                d.attach_since(d.stmts.len() - 1);
            }
            Some(old) if old != name => {
                d.change(
                    "schema",
                    Action::Renamed,
                    name.clone(),
                    format!("was {old}"),
                    None,
                    None,
                );
                d.stmt(
                    order::RENAME_SCHEMA,
                    format!("ALTER SCHEMA {old} RENAME TO {name};"),
                );
                d.attach_since(d.stmts.len() - 1);
            }
            _ => {}
        }
    }
    for (oid, name) in &b.schemas {
        if !a.schemas.contains_key(oid) {
            d.change(
                "schema",
                Action::Dropped,
                name.clone(),
                String::new(),
                None,
                None,
            );
            d.stmt(order::DROP_SCHEMA, format!("DROP SCHEMA {name};"));
        }
    }
}

pub(super) fn extensions(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, (name, schema, version)) in &a.extensions {
        match b.extensions.get(oid) {
            None => {
                d.change(
                    "extension",
                    Action::Added,
                    name.clone(),
                    format!("version {version}"),
                    None,
                    None,
                );
                d.stmt(
                    order::EXTENSION,
                    format!(
                        "CREATE EXTENSION IF NOT EXISTS {name} WITH SCHEMA {schema} VERSION {};",
                        literal(version)
                    ),
                );
            }
            Some((_, _, v)) if v != version => {
                d.change(
                    "extension",
                    Action::Altered,
                    name.clone(),
                    format!("version {v} -> {version}"),
                    None,
                    None,
                );
                d.stmt(
                    order::EXTENSION,
                    format!("ALTER EXTENSION {name} UPDATE TO {};", literal(version)),
                );
            }
            _ => {}
        }
    }
    for (oid, (name, _, _)) in &b.extensions {
        if !a.extensions.contains_key(oid) {
            d.change(
                "extension",
                Action::Dropped,
                name.clone(),
                String::new(),
                None,
                None,
            );
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

pub(super) fn functions(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, f) in &a.functions {
        let sig = format!("{}({})", q(&f.schema, &f.name), f.extra);
        match b.functions.get(oid) {
            None => {
                d.change(
                    "function",
                    Action::Added,
                    sig,
                    String::new(),
                    None,
                    Some(f.def.clone()),
                );
                if f.flag == "a" {
                    d.notes.push(format!(
                        "aggregate {} is not reproduced by the patch",
                        f.name
                    ));
                } else {
                    d.stmt(order::FUNCTION, format!("{};", f.def.trim_end()));
                }
            }
            Some(old) => {
                let renamed = old.name != f.name || old.schema != f.schema;
                let norm = |o: &Object| {
                    o.def
                        .replacen(&format!("{}(", q(&o.schema, &o.name)), "_(", 1)
                };
                let changed = norm(old) != norm(f);
                if renamed {
                    let from = d.stmts.len();
                    d.change(
                        "function",
                        Action::Renamed,
                        sig.clone(),
                        format!("was {}({})", q(&old.schema, &old.name), old.extra),
                        None,
                        None,
                    );
                    let w = function_word(f);
                    let mut cur = q(&old.schema, &old.name);
                    if old.name != f.name {
                        d.stmt(
                            order::RENAME_FUNCTION,
                            format!("ALTER {w} {cur}({}) RENAME TO {};", old.extra, f.name),
                        );
                        cur = q(&old.schema, &f.name);
                    }
                    if old.schema != f.schema {
                        d.stmt(
                            order::RENAME_FUNCTION,
                            format!("ALTER {w} {cur}({}) SET SCHEMA {};", old.extra, f.schema),
                        );
                    }
                    d.attach_since(from);
                }
                if changed {
                    d.change(
                        "function",
                        Action::Altered,
                        sig,
                        "definition changed".into(),
                        Some(old.def.clone()),
                        Some(f.def.clone()),
                    );
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
            d.change(
                "function",
                Action::Dropped,
                sig.clone(),
                String::new(),
                Some(f.def.clone()),
                None,
            );
            d.stmt(
                order::DROP_FUNCTION,
                format!("DROP {} {sig};", function_word(f)),
            );
            d.attach_since(d.stmts.len() - 1);
        }
    }
}

pub(super) fn sequences(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, s) in &a.sequences {
        let name = s.qname();
        let old = b.sequences.get(oid);
        match old {
            None => {
                // The statements that make it (none for an identity column's own): promotion
                // runs them before the tables whose defaults use it, OWNED BY after.
                let made = (!s.identity).then(|| {
                    let mut m = format!("CREATE SEQUENCE {name} {};", s.params);
                    if let Some(o) = &s.owned_by {
                        m.push_str(&format!("\nALTER SEQUENCE {name} OWNED BY {o};"));
                    }
                    m
                });
                d.change(
                    "sequence",
                    Action::Added,
                    name.clone(),
                    s.params.clone(),
                    None,
                    made,
                );
                if !s.identity {
                    d.stmt(
                        order::CREATE_SEQUENCE,
                        format!("CREATE SEQUENCE {name} {};", s.params),
                    );
                    if let Some(o) = &s.owned_by {
                        d.stmt(
                            order::OWNED_BY,
                            format!("ALTER SEQUENCE {name} OWNED BY {o};"),
                        );
                    }
                }
            }
            Some(old) => {
                if old.name != s.name || old.schema != s.schema {
                    let from = d.stmts.len();
                    d.change(
                        "sequence",
                        Action::Renamed,
                        name.clone(),
                        format!("was {}", old.qname()),
                        None,
                        None,
                    );
                    if !s.identity {
                        let mut cur = old.qname();
                        if old.name != s.name {
                            d.stmt(
                                order::RENAME_SEQUENCE,
                                format!("ALTER SEQUENCE {cur} RENAME TO {};", s.name),
                            );
                            cur = q(&old.schema, &s.name);
                        }
                        if old.schema != s.schema {
                            d.stmt(
                                order::RENAME_SEQUENCE,
                                format!("ALTER SEQUENCE {cur} SET SCHEMA {};", s.schema),
                            );
                        }
                    }
                    d.attach_since(from);
                }
                if old.params != s.params {
                    d.change(
                        "sequence",
                        Action::Altered,
                        name.clone(),
                        format!("{} -> {}", old.params, s.params),
                        None,
                        None,
                    );
                    d.stmt(
                        order::ALTER_SEQUENCE,
                        format!("ALTER SEQUENCE {name} {};", s.params),
                    );
                    d.attach_since(d.stmts.len() - 1);
                }
            }
        }
        let before = old.and_then(|o| o.state.clone());
        if let Some((v, called)) = &s.state {
            let fresh_default = old.is_none() && !called;
            if before.as_ref() != Some(&(v.clone(), *called)) && !fresh_default {
                d.sequences.push(SequenceChange {
                    sequence: name.clone(),
                    before: before.map(|(v, c)| SeqState {
                        last_value: v,
                        is_called: c,
                    }),
                    after: SeqState {
                        last_value: v.clone(),
                        is_called: *called,
                    },
                });
                d.stmt(
                    order::SETVAL,
                    format!(
                        "SELECT pg_catalog.setval({}, {v}, {called});",
                        literal(&name)
                    ),
                );
            }
        }
    }
    for (oid, s) in &b.sequences {
        if !a.sequences.contains_key(oid) {
            // What owns it (dropped with its table or column), for promotion.
            let owner = match (&s.owned_by, s.identity) {
                (Some(o), _) => Some(format!("OWNED BY {o}")),
                (None, true) => Some("OWNED BY an identity column".into()),
                (None, false) => None,
            };
            d.change(
                "sequence",
                Action::Dropped,
                s.qname(),
                String::new(),
                owner,
                None,
            );
            if !s.identity && s.owned_by.is_none() {
                d.stmt(
                    order::DROP_SEQUENCE,
                    format!("DROP SEQUENCE {};", s.qname()),
                );
            }
        }
    }
    if let Some(e) = a.sequence_error.as_ref().or(b.sequence_error.as_ref()) {
        d.notes
            .push(format!("sequence positions could not be read: {e}"));
    }
}

fn type_word(t: &Object) -> &'static str {
    if t.flag == "d" {
        "DOMAIN"
    } else {
        "TYPE"
    }
}

pub(super) fn types(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    for (oid, t) in &a.types {
        let name = q(&t.schema, &t.name);
        let w = type_word(t);
        match b.types.get(oid) {
            None => {
                d.change(
                    "type",
                    Action::Added,
                    name.clone(),
                    t.def.clone(),
                    None,
                    Some(t.def.clone()),
                );
                d.stmt(order::TYPE, format!("CREATE {w} {name} AS {};", t.def));
            }
            Some(old) => {
                if old.name != t.name || old.schema != t.schema {
                    let was = q(&old.schema, &old.name);
                    d.change(
                        "type",
                        Action::Renamed,
                        name.clone(),
                        format!("was {was}"),
                        None,
                        None,
                    );
                    let mut cur = was;
                    if old.name != t.name {
                        d.stmt(
                            order::TYPE,
                            format!("ALTER {w} {cur} RENAME TO {};", t.name),
                        );
                        cur = q(&old.schema, &t.name);
                    }
                    if old.schema != t.schema {
                        d.stmt(
                            order::TYPE,
                            format!("ALTER {w} {cur} SET SCHEMA {};", t.schema),
                        );
                    }
                }
                if old.def != t.def {
                    d.change(
                        "type",
                        Action::Altered,
                        name.clone(),
                        format!("{} -> {}", old.def, t.def),
                        Some(old.def.clone()),
                        Some(t.def.clone()),
                    );
                    d.notes.push(format!(
                        "the change to type {name} is not reproduced by the patch"
                    ));
                }
            }
        }
    }
    for (oid, t) in &b.types {
        if !a.types.contains_key(oid) {
            let name = q(&t.schema, &t.name);
            d.change(
                "type",
                Action::Dropped,
                name.clone(),
                t.def.clone(),
                Some(t.def.clone()),
                None,
            );
            d.stmt(order::DROP_TYPE, format!("DROP {} {name};", type_word(t)));
        }
    }
}
