//! Comments and privileges (`COMMENT ON`, `GRANT`/`REVOKE`) of objects that exist in the
//! scratch database, compared with the golden's. An object the patch creates (new, or
//! dropped and created again) starts with no comment and the default privileges, so that is
//! what it is compared with.

use std::collections::BTreeMap;

use super::SchemaDiff;
use crate::review::catalog::{Catalog, ObjKey, Privileges};
use crate::review::conn::literal;
use crate::review::model::Action;
use crate::review::sql::{order, q, table_name};

/// How the patch names an object.
struct Target {
    /// For the review.
    display: String,
    /// After `COMMENT ON`.
    comment: String,
    /// Privileges: the column they are limited to (each privilege names it), and ` ON …`.
    grant: Option<(Option<String>, String)>,
}

fn target(cat: &Catalog, (k, oid, sub): ObjKey) -> Option<Target> {
    let t = |display: String, comment: String, grant: Option<(Option<String>, String)>| {
        Some(Target {
            display,
            comment,
            grant,
        })
    };
    match k {
        'c' if sub > 0 => {
            let tab = cat.tables.get(&oid)?;
            let col = tab.column(sub)?;
            let d = format!("{}.{}", tab.qname(), col.name);
            t(
                d.clone(),
                format!("COLUMN {d}"),
                Some((Some(col.name.clone()), format!(" ON TABLE {}", tab.qname()))),
            )
        }
        'c' => {
            if let Some(tab) = cat.tables.get(&oid) {
                let n = tab.qname();
                t(
                    n.clone(),
                    format!("TABLE {n}"),
                    Some((None, format!(" ON TABLE {n}"))),
                )
            } else if let Some(v) = cat.views.get(&oid) {
                let n = q(&v.schema, &v.name);
                let w = if v.flag == "m" {
                    "MATERIALIZED VIEW"
                } else {
                    "VIEW"
                };
                t(
                    n.clone(),
                    format!("{w} {n}"),
                    Some((None, format!(" ON TABLE {n}"))),
                )
            } else if let Some(s) = cat.sequences.get(&oid) {
                let n = s.qname();
                t(
                    n.clone(),
                    format!("SEQUENCE {n}"),
                    Some((None, format!(" ON SEQUENCE {n}"))),
                )
            } else if let Some(i) = cat.indexes.get(&oid) {
                let n = q(&i.schema, &i.name);
                t(n.clone(), format!("INDEX {n}"), None)
            } else {
                None
            }
        }
        'f' => {
            // Aggregates are not reproduced by the patch.
            let f = cat.functions.get(&oid).filter(|f| f.flag != "a")?;
            let w = if f.flag == "p" {
                "PROCEDURE"
            } else {
                "FUNCTION"
            };
            let sig = format!("{}({})", q(&f.schema, &f.name), f.extra);
            t(
                sig.clone(),
                format!("{w} {sig}"),
                Some((None, format!(" ON {w} {sig}"))),
            )
        }
        'n' => {
            let n = cat.schemas.get(&oid)?;
            t(
                n.clone(),
                format!("SCHEMA {n}"),
                Some((None, format!(" ON SCHEMA {n}"))),
            )
        }
        't' => {
            let ty = cat.types.get(&oid)?;
            let n = q(&ty.schema, &ty.name);
            let w = if ty.flag == "d" { "DOMAIN" } else { "TYPE" };
            t(
                n.clone(),
                format!("{w} {n}"),
                Some((None, format!(" ON {w} {n}"))),
            )
        }
        'k' => {
            let c = cat.constraints.get(&oid)?;
            let tn = table_name(cat, c.table);
            t(
                format!("{tn}.{}", c.name),
                format!("CONSTRAINT {} ON {tn}", c.name),
                None,
            )
        }
        'g' => {
            let g = cat.triggers.get(&oid)?;
            let tn = table_name(cat, g.table);
            t(
                format!("{tn}.{}", g.name),
                format!("TRIGGER {} ON {tn}", g.name),
                None,
            )
        }
        _ => None,
    }
}

/// Whether the object exists in the golden and the patch keeps it (not created anew).
fn kept(b: &Catalog, d: &SchemaDiff, key: ObjKey) -> bool {
    target(b, key).is_some() && !d.recreated.contains(&(key.0, key.1))
}

/// What `kind` word a key's change is reported under.
fn kind_word(a: &Catalog, (k, oid, sub): ObjKey) -> &'static str {
    match k {
        'c' if sub > 0 => "column",
        'c' if a.tables.contains_key(&oid) => "table",
        'c' if a.views.contains_key(&oid) => "view",
        'c' if a.sequences.contains_key(&oid) => "sequence",
        'c' => "index",
        'f' => "function",
        'n' => "schema",
        't' => "type",
        'k' => "constraint",
        _ => "trigger",
    }
}

pub(in crate::review) fn comments(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    let mut keys: Vec<ObjKey> = a.comments.keys().copied().collect();
    keys.extend(b.comments.keys().filter(|k| !a.comments.contains_key(k)));
    keys.sort();
    for key in keys {
        let Some(t) = target(a, key) else { continue };
        let before = if kept(b, d, key) {
            b.comments.get(&key)
        } else {
            None
        };
        let after = a.comments.get(&key);
        if before == after {
            continue;
        }
        let action = match (before, after) {
            (None, _) => Action::Added,
            (_, None) => Action::Dropped,
            _ => Action::Altered,
        };
        d.change(
            "comment",
            action,
            t.display,
            format!("on {}", kind_word(a, key)),
            before.cloned(),
            after.cloned(),
        );
        let value = after.map(|s| literal(s)).unwrap_or_else(|| "NULL".into());
        d.stmt(
            order::COMMENT,
            format!("COMMENT ON {} IS {value};", t.comment),
        );
        d.attach_since(d.stmts.len() - 1);
    }
}

/// Privileges a freshly created object has besides its owner's (`acldefault`).
fn fresh(key: ObjKey) -> Privileges {
    let public = |p: &str| {
        BTreeMap::from([(
            "PUBLIC".to_string(),
            BTreeMap::from([(p.to_string(), false)]),
        )])
    };
    match key.0 {
        'f' => public("EXECUTE"),
        't' => public("USAGE"),
        _ => Privileges::new(),
    }
}

pub(in crate::review) fn grants(b: &Catalog, a: &Catalog, d: &mut SchemaDiff) {
    let mut keys: Vec<ObjKey> = a.acls.keys().copied().collect();
    keys.extend(b.acls.keys().filter(|k| !a.acls.contains_key(k)));
    // New objects whose privileges are all gone still differ from the default.
    keys.extend(
        a.functions
            .keys()
            .map(|o| ('f', *o, 0))
            .chain(a.types.keys().map(|o| ('t', *o, 0)))
            .filter(|k| !a.acls.contains_key(k)),
    );
    keys.sort();
    keys.dedup();
    let empty = Privileges::new();
    for key in keys {
        let Some(t) = target(a, key) else { continue };
        let Some((cols, on)) = &t.grant else { continue };
        let before = if kept(b, d, key) {
            b.acls.get(&key).cloned().unwrap_or_default()
        } else {
            fresh(key)
        };
        let after = a.acls.get(&key).unwrap_or(&empty);
        let grantees: std::collections::BTreeSet<&String> =
            before.keys().chain(after.keys()).collect();
        for g in grantees {
            let no = BTreeMap::new();
            let old = before.get(g).unwrap_or(&no);
            let new = after.get(g).unwrap_or(&no);
            let (mut grant, mut grant_opt, mut revoke, mut revoke_opt) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (p, go) in new {
                match old.get(p) {
                    None | Some(false) if *go => grant_opt.push(p.clone()),
                    None => grant.push(p.clone()),
                    Some(true) if !go => revoke_opt.push(p.clone()),
                    _ => {}
                }
            }
            for p in old.keys() {
                if !new.contains_key(p) {
                    revoke.push(p.clone());
                }
            }
            let col = |ps: &[String]| {
                ps.iter()
                    .map(|p| match cols {
                        Some(c) => format!("{p} ({c})"),
                        None => p.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut granted = Vec::new();
            let from = d.stmts.len();
            if !grant.is_empty() {
                d.stmt(order::GRANT, format!("GRANT {}{on} TO {g};", col(&grant)));
                granted.push(col(&grant));
            }
            if !grant_opt.is_empty() {
                d.stmt(
                    order::GRANT,
                    format!("GRANT {}{on} TO {g} WITH GRANT OPTION;", col(&grant_opt)),
                );
                granted.push(format!("{} with grant option", col(&grant_opt)));
            }
            if !granted.is_empty() {
                d.change(
                    "grant",
                    Action::Added,
                    t.display.clone(),
                    format!("to {g}: {}", granted.join("; ")),
                    None,
                    None,
                );
                d.attach_since(from);
            }
            let mut revoked = Vec::new();
            let from = d.stmts.len();
            if !revoke_opt.is_empty() {
                d.stmt(
                    order::GRANT,
                    format!("REVOKE GRANT OPTION FOR {}{on} FROM {g};", col(&revoke_opt)),
                );
                revoked.push(format!("grant option for {}", col(&revoke_opt)));
            }
            if !revoke.is_empty() {
                d.stmt(
                    order::GRANT,
                    format!("REVOKE {}{on} FROM {g};", col(&revoke)),
                );
                revoked.push(col(&revoke));
            }
            if !revoked.is_empty() {
                d.change(
                    "grant",
                    Action::Dropped,
                    t.display.clone(),
                    format!("from {g}: {}", revoked.join("; ")),
                    None,
                    None,
                );
                d.attach_since(from);
            }
        }
    }
}
