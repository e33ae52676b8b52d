//! Comments and privileges of the objects the catalog snapshot covers, keyed by
//! [`ObjKey`]. Privileges are read exploded (`aclexplode`) with a NULL ACL read as the
//! built-in default (`acldefault`), so "never granted" and "granted back to the default"
//! compare equal. The owner's own entries are left out: the patch's objects belong to
//! whoever applies it.

use std::collections::BTreeMap;

use super::{not_ext_member, oid, text, user_ns, Catalog};
use crate::review::conn::{ConnError, Side};

/// Which catalog an object lives in: 'c' pg_class (tables, views, sequences, indexes, and
/// their columns as `sub`), 'f' pg_proc, 'n' pg_namespace, 't' pg_type, 'k' pg_constraint,
/// 'g' pg_trigger.
pub type ObjKey = (char, u32, i32);

/// Privileges of one object: grantee (quoted, or `PUBLIC`) → privilege → grant option.
pub type Privileges = BTreeMap<String, BTreeMap<String, bool>>;

fn key(r: &[Option<String>]) -> ObjKey {
    (
        text(&r[0]).chars().next().unwrap_or('?'),
        oid(&r[1]),
        r[2].as_deref().and_then(|s| s.parse().ok()).unwrap_or(0),
    )
}

/// Reads comments and privileges into `cat` (inside the caller's transaction).
pub(super) async fn read(
    side: &Side,
    cat: &mut Catalog,
    rel_filter: &str,
) -> Result<(), ConnError> {
    let class = |c: &str| format!("'pg_catalog.{c}'::pg_catalog.regclass");
    // System objects have OIDs below FirstNormalObjectId (16384); schema `public` is the
    // exception that matters.
    let q = format!(
        "SELECT CASE d.classoid WHEN {} THEN 'c' WHEN {} THEN 'f' WHEN {} THEN 'n' \
         WHEN {} THEN 't' WHEN {} THEN 'k' WHEN {} THEN 'g' END, d.objoid, d.objsubid, d.description \
         FROM pg_catalog.pg_description d WHERE d.classoid IN ({}, {}, {}, {}, {}, {}) \
         AND (d.objoid >= 16384 OR d.classoid = {})",
        class("pg_class"),
        class("pg_proc"),
        class("pg_namespace"),
        class("pg_type"),
        class("pg_constraint"),
        class("pg_trigger"),
        class("pg_class"),
        class("pg_proc"),
        class("pg_namespace"),
        class("pg_type"),
        class("pg_constraint"),
        class("pg_trigger"),
        class("pg_namespace"),
    );
    cat.comments = side
        .rows(&q)
        .await?
        .iter()
        .map(|r| (key(r), text(&r[3])))
        .collect();
    let q = format!(
        "WITH objs(k, oid, sub, acl, owner) AS ( \
         SELECT 'c'::pg_catalog.text, c.oid, 0::pg_catalog.int4, COALESCE(c.relacl, pg_catalog.acldefault( \
           (CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END)::pg_catalog.\"char\", c.relowner)), c.relowner \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S') AND c.relpersistence <> 't' AND {rel_filter} \
         UNION ALL SELECT 'c', a.attrelid, a.attnum::pg_catalog.int4, a.attacl, c.relowner \
         FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE a.attacl IS NOT NULL AND a.attnum > 0 AND NOT a.attisdropped \
         AND c.relkind IN ('r', 'p') AND c.relpersistence <> 't' AND {rel_filter} \
         UNION ALL SELECT 'f', p.oid, 0, COALESCE(p.proacl, pg_catalog.acldefault('f', p.proowner)), p.proowner \
         FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
         WHERE {} AND {} \
         UNION ALL SELECT 'n', n.oid, 0, COALESCE(n.nspacl, pg_catalog.acldefault('n', n.nspowner)), n.nspowner \
         FROM pg_catalog.pg_namespace n WHERE {} AND {} \
         UNION ALL SELECT 't', t.oid, 0, COALESCE(t.typacl, pg_catalog.acldefault('T', t.typowner)), t.typowner \
         FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace \
         WHERE t.typtype IN ('e', 'd', 'c') AND {} AND {}) \
         SELECT o.k, o.oid, o.sub, CASE WHEN x.grantee = 0 THEN 'PUBLIC' \
           ELSE pg_catalog.quote_ident(r.rolname) END, x.privilege_type, x.is_grantable \
         FROM objs o CROSS JOIN LATERAL pg_catalog.aclexplode(o.acl) x \
         LEFT JOIN pg_catalog.pg_roles r ON r.oid = x.grantee \
         WHERE x.grantee <> o.owner",
        user_ns("n"),
        not_ext_member("pg_proc", "p.oid"),
        user_ns("n"),
        not_ext_member("pg_namespace", "n.oid"),
        user_ns("n"),
        not_ext_member("pg_type", "t.oid"),
    );
    for r in side.rows(&q).await? {
        // Several grantors may give the same privilege: the grant option wins.
        let e = cat
            .acls
            .entry(key(&r))
            .or_default()
            .entry(text(&r[3]))
            .or_default()
            .entry(text(&r[4]))
            .or_insert(false);
        *e |= r[5].as_deref() == Some("t");
    }
    Ok(())
}
