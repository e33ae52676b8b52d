//! SQL fragments the dump's queries share: which schemas and objects are the database's own,
//! roles with the owner spelled `<owner>`, privileges, comments, qualified names.

/// Schemas that are not the database's own.
pub(crate) fn user_ns(n: &str) -> String {
    format!(
        "{n}.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') \
         AND {n}.nspname !~ '^pg_(toast_)?temp_'"
    )
}

/// Not a member of an extension (those are compared as the extension and its version).
pub(crate) fn no_ext(catalog: &str, oid: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend e WHERE e.classid = \
         'pg_catalog.{catalog}'::pg_catalog.regclass AND e.objid = {oid} AND e.deptype = 'e')"
    )
}

/// A role's name, with the owner of the database's objects spelled `<owner>`: that role has
/// a name of its own in each fork under some providers.
pub(super) fn role(oid: &str, owner: &str) -> String {
    format!(
        "CASE WHEN {oid} = 0 THEN 'PUBLIC' WHEN pg_catalog.pg_get_userbyid({oid}) = {owner} \
         THEN '<owner>' ELSE pg_catalog.pg_get_userbyid({oid})::pg_catalog.text END"
    )
}

/// Privileges as a sorted list; a NULL ACL (the default) is spelled out, so a grant undone
/// by a revoke reads the same as no grant at all.
pub(super) fn acl(col: &str, kind: &str, owner_col: &str, owner: &str) -> String {
    let g = role("a.grantee", owner);
    let r = role("a.grantor", owner);
    format!(
        "COALESCE((SELECT pg_catalog.string_agg(({g}) || '=' || a.privilege_type || \
         CASE WHEN a.is_grantable THEN '*' ELSE '' END || '/' || ({r}), ',' \
         ORDER BY ({g}), a.privilege_type, ({r})) FROM pg_catalog.aclexplode(COALESCE({col}, \
         pg_catalog.acldefault({kind}, {owner_col}))) a), '')"
    )
}

/// A comment, quoted, or `-`.
pub(super) fn comment(expr: &str) -> String {
    format!("COALESCE(pg_catalog.quote_literal({expr}), '-')")
}

pub(super) fn qname(n: &str, name: &str) -> String {
    format!("pg_catalog.quote_ident({n}.nspname) || '.' || pg_catalog.quote_ident({name})")
}
