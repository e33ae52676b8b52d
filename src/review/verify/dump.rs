//! A canonical description of one database for the patch check, read independently of the
//! diff's own catalog code (a gap there must not hide itself here): every schema object as
//! a `key → definition` line, every table's content hash and every sequence's position, all
//! computed by the server as the review role (search path pinned to `pg_catalog`, so every
//! name is printed qualified and no agent-defined function or operator is ever resolved).

use std::collections::{BTreeMap, BTreeSet};

use crate::review::conn::{literal, ConnError, Side};

/// What the patch check compares, for one database.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Dump {
    /// Schema objects: `"<kind> <qualified name>"` → definition (owner, privileges and
    /// comment included; the owner role spelled `<owner>`).
    pub objects: BTreeMap<String, String>,
    /// Table contents: qualified table name → `(rows, md5 of the sorted row hashes)`, or the
    /// error reading it.
    pub tables: BTreeMap<String, Result<(u64, String), String>>,
    /// Sequence positions: qualified name → `last_value called=is_called`.
    pub sequences: BTreeMap<String, String>,
    /// Tables not hashed: shown unchanged since the golden on both sides
    /// ([`crate::review::touched`]).
    pub unchanged: usize,
}

/// Tables hashed in one round trip.
const BATCH: usize = 100;

mod rarer;
mod sql;

use sql::{acl, comment, qname, role};
pub(crate) use sql::{no_ext, user_ns};

/// The queries of the schema part, each returning `(key, definition)`.
fn schema_queries(owner: &str) -> Vec<(&'static str, String)> {
    let o = literal(owner);
    let o = o.as_str();
    let rel = qname("n", "c.relname");
    let mut q = Vec::new();
    q.push((
        "schema",
        format!(
        "SELECT 'schema ' || pg_catalog.quote_ident(n.nspname), 'owner=' || ({}) || ' acl=' || {} \
         || ' comment=' || {} FROM pg_catalog.pg_namespace n WHERE {} AND {}",
        role("n.nspowner", o),
        acl("n.nspacl", "'n'", "n.nspowner", o),
        comment("pg_catalog.obj_description(n.oid, 'pg_namespace')"),
        user_ns("n"),
        no_ext("pg_namespace", "n.oid")
        ),
    ));
    q.push((
        "extension",
        "SELECT 'extension ' || pg_catalog.quote_ident(x.extname), 'version=' || x.extversion \
         || ' schema=' || pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension x \
         JOIN pg_catalog.pg_namespace n ON n.oid = x.extnamespace"
            .to_string(),
    ));
    q.push((
        "relation",
        format!(
        "SELECT 'relation ' || {rel}, 'kind=' || c.relkind::pg_catalog.text || ' persistence=' || c.relpersistence::pg_catalog.text \
         || ' owner=' || ({}) || ' acl=' || {} || ' comment=' || {} \
         || ' options=' || COALESCE(c.reloptions::pg_catalog.text, '') \
         || ' rls=' || c.relrowsecurity || '/' || c.relforcerowsecurity \
         || ' replident=' || c.relreplident::pg_catalog.text \
         || ' partkey=' || COALESCE(pg_catalog.pg_get_partkeydef(c.oid), '') \
         || ' partbound=' || COALESCE(pg_catalog.pg_get_expr(c.relpartbound, c.oid), '') \
         || ' inherits=' || COALESCE((SELECT pg_catalog.string_agg(i.inhparent::pg_catalog.regclass::pg_catalog.text, ',' ORDER BY i.inhseqno) \
              FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid), '') \
         || CASE WHEN c.relkind IN ('v', 'm') THEN ' populated=' || c.relispopulated \
              || ' def=' || pg_catalog.pg_get_viewdef(c.oid) ELSE '' END \
         || CASE WHEN c.relkind = 'S' THEN COALESCE((SELECT ' type=' || pg_catalog.format_type(s.seqtypid, NULL) \
              || ' start=' || s.seqstart || ' increment=' || s.seqincrement || ' max=' || s.seqmax \
              || ' min=' || s.seqmin || ' cache=' || s.seqcache || ' cycle=' || s.seqcycle \
              FROM pg_catalog.pg_sequence s WHERE s.seqrelid = c.oid), '') \
            || ' owned_by=' || COALESCE((SELECT d.refobjid::pg_catalog.regclass::pg_catalog.text || '.' \
              || pg_catalog.quote_ident(a.attname) FROM pg_catalog.pg_depend d \
              JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid \
              WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objid = c.oid \
              AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype IN ('a', 'i') \
              LIMIT 1), '-') ELSE '' END \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND {} AND {}",
        role("c.relowner", o),
        acl(
            "c.relacl",
            "CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::pg_catalog.\"char\"",
            "c.relowner",
            o
        ),
        comment("pg_catalog.obj_description(c.oid, 'pg_class')"),
        user_ns("n"),
        no_ext("pg_class", "c.oid")
        ),
    ));
    q.push((
        "column",
        format!(
        "SELECT 'column ' || {rel} || '.' || pg_catalog.quote_ident(a.attname), \
         'position=' || pg_catalog.row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum) \
         || ' type=' || pg_catalog.format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull \
         || ' default=' || COALESCE(pg_catalog.pg_get_expr(ad.adbin, ad.adrelid), '-') \
         || ' identity=' || a.attidentity::pg_catalog.text || ' generated=' || a.attgenerated::pg_catalog.text \
         || ' collation=' || COALESCE((SELECT pg_catalog.quote_ident(cn.nspname) || '.' || pg_catalog.quote_ident(co.collname) \
              FROM pg_catalog.pg_collation co JOIN pg_catalog.pg_namespace cn ON cn.oid = co.collnamespace \
              WHERE co.oid = a.attcollation AND a.attcollation <> t.typcollation), '-') \
         || ' storage=' || a.attstorage::pg_catalog.text || ' acl=' || {} || ' comment=' || {} \
         FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_catalog.pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum \
         WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
         AND {} AND {}",
        acl("a.attacl", "'c'", "c.relowner", o),
        comment("pg_catalog.col_description(c.oid, a.attnum)"),
        user_ns("n"),
        no_ext("pg_class", "c.oid")
        ),
    ));
    q.push((
        "constraint",
        format!(
            "SELECT 'constraint ' || {rel} || '.' || pg_catalog.quote_ident(k.conname), \
         pg_catalog.pg_get_constraintdef(k.oid) || ' comment=' || {} \
         FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class c ON c.oid = k.conrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE {} AND {}",
            comment("pg_catalog.obj_description(k.oid, 'pg_constraint')"),
            user_ns("n"),
            no_ext("pg_class", "c.oid")
        ),
    ));
    q.push((
        "constraint",
        format!(
            "SELECT 'constraint ' || {} || '.' || pg_catalog.quote_ident(k.conname), \
         pg_catalog.pg_get_constraintdef(k.oid) || ' comment=' || {} \
         FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_type t ON t.oid = k.contypid \
         JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE {} AND {}",
            qname("n", "t.typname"),
            comment("pg_catalog.obj_description(k.oid, 'pg_constraint')"),
            user_ns("n"),
            no_ext("pg_type", "t.oid")
        ),
    ));
    q.push((
        "index",
        format!(
            "SELECT 'index ' || {}, pg_catalog.pg_get_indexdef(i.indexrelid) \
         || ' clustered=' || i.indisclustered || ' valid=' || i.indisvalid \
         || ' replident=' || i.indisreplident || ' comment=' || {} \
         FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = ic.relnamespace WHERE {} AND {}",
            qname("n", "ic.relname"),
            comment("pg_catalog.obj_description(ic.oid, 'pg_class')"),
            user_ns("n"),
            no_ext("pg_class", "i.indrelid")
        ),
    ));
    q.push((
        "trigger",
        format!(
        "SELECT 'trigger ' || {rel} || '.' || pg_catalog.quote_ident(tg.tgname), \
         pg_catalog.pg_get_triggerdef(tg.oid) || ' enabled=' || tg.tgenabled::pg_catalog.text || ' comment=' || {} \
         FROM pg_catalog.pg_trigger tg JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE NOT tg.tgisinternal AND {} AND {}",
        comment("pg_catalog.obj_description(tg.oid, 'pg_trigger')"),
        user_ns("n"),
        no_ext("pg_class", "c.oid")
        ),
    ));
    q.push((
        "function",
        format!(
        "SELECT 'function ' || {} || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')', \
         CASE WHEN p.prokind = 'a' THEN COALESCE((SELECT 'aggregate transition=' || g.aggtransfn::pg_catalog.text \
              || ' final=' || g.aggfinalfn::pg_catalog.text || ' combine=' || g.aggcombinefn::pg_catalog.text \
              || ' state=' || pg_catalog.format_type(g.aggtranstype, NULL) \
              || ' initial=' || COALESCE(g.agginitval, '-') || ' kind=' || g.aggkind::pg_catalog.text \
              || ' sortop=' || g.aggsortop::pg_catalog.regoperator::pg_catalog.text \
              FROM pg_catalog.pg_aggregate g WHERE g.aggfnoid = p.oid), '') \
              || ' returns ' || pg_catalog.pg_get_function_result(p.oid) \
         ELSE pg_catalog.pg_get_functiondef(p.oid) END \
         || ' owner=' || ({}) || ' acl=' || {} || ' comment=' || {} \
         FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
         WHERE {} AND {}",
        qname("n", "p.proname"),
        role("p.proowner", o),
        acl("p.proacl", "'f'", "p.proowner", o),
        comment("pg_catalog.obj_description(p.oid, 'pg_proc')"),
        user_ns("n"),
        no_ext("pg_proc", "p.oid")
        ),
    ));
    q.push((
        "type",
        format!(
        "SELECT 'type ' || {}, 'kind=' || t.typtype::pg_catalog.text || CASE t.typtype \
           WHEN 'e' THEN ' labels=' || COALESCE((SELECT pg_catalog.string_agg(pg_catalog.quote_literal(e.enumlabel), ',' \
              ORDER BY e.enumsortorder) FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid), '') \
           WHEN 'd' THEN ' base=' || pg_catalog.format_type(t.typbasetype, t.typtypmod) \
              || ' notnull=' || t.typnotnull || ' default=' || COALESCE(pg_catalog.pg_get_expr(t.typdefaultbin, 0), '-') \
           WHEN 'c' THEN ' attributes=' || COALESCE((SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname) || ' ' \
              || pg_catalog.format_type(a.atttypid, a.atttypmod), ',' ORDER BY a.attnum) FROM pg_catalog.pg_attribute a \
              WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped), '') \
           WHEN 'r' THEN ' subtype=' || COALESCE((SELECT pg_catalog.format_type(r.rngsubtype, NULL) \
              FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid), '') \
           ELSE '' END \
         || ' owner=' || ({}) || ' acl=' || {} || ' comment=' || {} \
         FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace \
         WHERE t.typtype IN ('e', 'd', 'c', 'r') AND (t.typtype <> 'c' OR EXISTS \
           (SELECT 1 FROM pg_catalog.pg_class tc WHERE tc.oid = t.typrelid AND tc.relkind = 'c')) \
         AND {} AND {}",
        qname("n", "t.typname"),
        role("t.typowner", o),
        acl("t.typacl", "'T'", "t.typowner", o),
        comment("pg_catalog.obj_description(t.oid, 'pg_type')"),
        user_ns("n"),
        no_ext("pg_type", "t.oid")
        ),
    ));
    let r = role("x", o);
    q.push((
        "policy",
        format!(
            "SELECT 'policy ' || {rel} || '.' || pg_catalog.quote_ident(po.polname), \
         'command=' || po.polcmd::pg_catalog.text || ' permissive=' || po.polpermissive \
         || ' roles=' || COALESCE((SELECT pg_catalog.string_agg({r}, ',' ORDER BY {r}) \
              FROM pg_catalog.unnest(po.polroles) x), '') \
         || ' using=' || COALESCE(pg_catalog.pg_get_expr(po.polqual, po.polrelid), '-') \
         || ' check=' || COALESCE(pg_catalog.pg_get_expr(po.polwithcheck, po.polrelid), '-') \
         || ' comment=' || {} \
         FROM pg_catalog.pg_policy po JOIN pg_catalog.pg_class c ON c.oid = po.polrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE {}",
            comment("pg_catalog.obj_description(po.oid, 'pg_policy')"),
            user_ns("n")
        ),
    ));
    q.push((
        "rule",
        format!(
            "SELECT 'rule ' || {rel} || '.' || pg_catalog.quote_ident(ru.rulename), \
         pg_catalog.pg_get_ruledef(ru.oid) || ' enabled=' || ru.ev_enabled::pg_catalog.text \
         FROM pg_catalog.pg_rewrite ru JOIN pg_catalog.pg_class c ON c.oid = ru.ev_class \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE ru.rulename <> '_RETURN' AND {} AND {}",
            user_ns("n"),
            no_ext("pg_class", "c.oid")
        ),
    ));
    q.push((
        "statistics",
        format!(
        "SELECT 'statistics ' || {}, pg_catalog.pg_get_statisticsobjdef(s.oid) \
         FROM pg_catalog.pg_statistic_ext s JOIN pg_catalog.pg_namespace n ON n.oid = s.stxnamespace \
         WHERE {}",
        qname("n", "s.stxname"),
        user_ns("n")
        ),
    ));
    q.push((
        "default privileges",
        format!(
        "SELECT 'default privileges of ' || ({}) || ' in ' || COALESCE(pg_catalog.quote_ident(n.nspname), '*') \
         || ' on ' || d.defaclobjtype::pg_catalog.text, {} \
         FROM pg_catalog.pg_default_acl d LEFT JOIN pg_catalog.pg_namespace n ON n.oid = d.defaclnamespace",
        role("d.defaclrole", o),
        acl("d.defaclacl", "'r'", "d.defaclrole", o)
        ),
    ));
    q.push((
        "collation",
        format!(
        "SELECT 'collation ' || {}, 'provider=' || co.collprovider::pg_catalog.text || ' collate=' || COALESCE(co.collcollate, '') \
         || ' ctype=' || COALESCE(co.collctype, '') || ' deterministic=' || co.collisdeterministic \
         FROM pg_catalog.pg_collation co JOIN pg_catalog.pg_namespace n ON n.oid = co.collnamespace \
         WHERE {} AND {}",
        qname("n", "co.collname"),
        user_ns("n"),
        no_ext("pg_collation", "co.oid")
        ),
    ));
    q.push((
        "operator",
        format!(
        "SELECT 'operator ' || o.oid::pg_catalog.regoperator::pg_catalog.text, \
         'function=' || o.oprcode::pg_catalog.text || ' commutator=' || o.oprcom::pg_catalog.regoperator::pg_catalog.text \
         || ' negator=' || o.oprnegate::pg_catalog.regoperator::pg_catalog.text \
         FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace \
         WHERE {} AND {}",
        user_ns("n"),
        no_ext("pg_operator", "o.oid")
        ),
    ));
    q.push((
        "publication",
        "SELECT 'publication ' || pg_catalog.quote_ident(p.pubname), 'all_tables=' || p.puballtables \
         || ' tables=' || COALESCE((SELECT pg_catalog.string_agg(r.prrelid::pg_catalog.regclass::pg_catalog.text, ',' \
              ORDER BY r.prrelid::pg_catalog.regclass::pg_catalog.text) \
              FROM pg_catalog.pg_publication_rel r WHERE r.prpubid = p.oid), '') \
         FROM pg_catalog.pg_publication p"
            .to_string(),
    ));
    // Only their number: their contents are not readable by the review role.
    q.push((
        "large objects",
        "SELECT 'large objects', 'count=' || pg_catalog.count(*) \
         FROM pg_catalog.pg_largeobject_metadata"
            .to_string(),
    ));
    q.extend(rarer::queries(o));
    q
}

fn text(v: &Option<String>) -> String {
    v.clone().unwrap_or_default()
}

/// The kinds of the schema queries, in order (a kind is the first words of its keys).
pub fn query_kinds() -> Vec<&'static str> {
    schema_queries("").into_iter().map(|(k, _)| k).collect()
}

/// The schema objects of the query kinds `kinds` only (`"policy"`, `"rule"`, …: the tags of
/// [`schema_queries`]), keyed as in [`Dump::objects`]; read inside the caller's snapshot.
pub async fn objects_of(
    side: &Side,
    owner: &str,
    kinds: &[&str],
) -> Result<BTreeMap<String, String>, ConnError> {
    let mut objects = BTreeMap::new();
    for (kind, q) in schema_queries(owner) {
        if !kinds.contains(&kind) {
            continue;
        }
        for r in side.rows(&q).await? {
            add(&mut objects, text(&r[0]), text(&r[1]));
        }
    }
    Ok(objects)
}

/// Keeps `def` under `key`; two objects under one key (overloads differing only in ways the
/// identity arguments hide) are both kept.
fn add(objects: &mut BTreeMap<String, String>, key: String, def: String) {
    objects
        .entry(key)
        .and_modify(|d| {
            d.push_str(" & ");
            d.push_str(&def)
        })
        .or_insert(def);
}

/// Read the dump, inside the caller's read-only snapshot. `owner` is the role that owns the
/// golden's objects in this database (spelled `<owner>` in the dump). `skip`: tables not to
/// hash, shown to hold the golden's rows on both sides compared (every other is hashed).
pub async fn take(side: &Side, owner: &str, skip: &BTreeSet<String>) -> Result<Dump, ConnError> {
    let mut dump = Dump::default();
    for (_, q) in schema_queries(owner) {
        for r in side.rows(&q).await? {
            add(&mut dump.objects, text(&r[0]), text(&r[1]));
        }
    }
    let rels = side
        .rows(&format!(
            "SELECT {}, c.relkind FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE (c.relkind = 'r' OR c.relkind = 'S' OR (c.relkind = 'm' AND c.relispopulated)) \
             AND c.relpersistence <> 't' AND {} ORDER BY 1",
            qname("n", "c.relname"),
            user_ns("n")
        ))
        .await?;
    let all: Vec<String> = rels
        .iter()
        .filter(|r| r[1].as_deref() != Some("S"))
        .map(|r| text(&r[0]))
        .collect();
    let tables: Vec<String> = all.iter().filter(|t| !skip.contains(*t)).cloned().collect();
    dump.unchanged = all.len() - tables.len();
    let seqs: Vec<String> = rels
        .iter()
        .filter(|r| r[1].as_deref() == Some("S"))
        .map(|r| text(&r[0]))
        .collect();
    for chunk in tables.chunks(BATCH) {
        let qs: Vec<String> = chunk.iter().map(|t| hash_query(t)).collect();
        side.exec("SAVEPOINT sandpit_verify").await?;
        match side.rows(&qs.join("; ")).await {
            Ok(rows) => {
                side.exec("RELEASE SAVEPOINT sandpit_verify").await?;
                for r in rows {
                    dump.tables.insert(text(&r[0]), Ok(hashed(&r)));
                }
            }
            Err(_) => {
                // One table could not be read: read them one by one to name it.
                side.exec("ROLLBACK TO SAVEPOINT sandpit_verify").await?;
                for (t, q) in chunk.iter().zip(&qs) {
                    side.exec("SAVEPOINT sandpit_verify").await?;
                    match side.rows(q).await {
                        Ok(rows) => {
                            side.exec("RELEASE SAVEPOINT sandpit_verify").await?;
                            if let Some(r) = rows.first() {
                                dump.tables.insert(t.clone(), Ok(hashed(r)));
                            }
                        }
                        Err(e) => {
                            side.exec("ROLLBACK TO SAVEPOINT sandpit_verify").await?;
                            dump.tables.insert(t.clone(), Err(e.to_string()));
                        }
                    }
                }
            }
        }
    }
    for chunk in seqs.chunks(BATCH) {
        let parts: Vec<String> = chunk
            .iter()
            .map(|s| {
                format!(
                    "SELECT {}::pg_catalog.text, last_value::pg_catalog.text || ' called=' || is_called FROM {s}",
                    literal(s)
                )
            })
            .collect();
        for r in side.rows(&parts.join(" UNION ALL ")).await? {
            dump.sequences.insert(text(&r[0]), text(&r[1]));
        }
    }
    Ok(dump)
}

/// Rows of one table, order-independent: the md5 of its rows' md5s in sorted order (each
/// row as its text output, in column order), and the row count.
fn hash_query(table: &str) -> String {
    format!(
        "SELECT {}::pg_catalog.text, pg_catalog.count(*)::pg_catalog.text, \
         pg_catalog.md5(COALESCE(pg_catalog.string_agg(x.h, '' ORDER BY x.h COLLATE pg_catalog.\"C\"), '')) \
         FROM (SELECT pg_catalog.md5(ROW(r.*)::pg_catalog.text) AS h FROM ONLY {table} r) x",
        literal(table)
    )
}

fn hashed(r: &[Option<String>]) -> (u64, String) {
    (
        r.get(1)
            .and_then(|v| v.as_deref())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        r.get(2).map(text).unwrap_or_default(),
    )
}

/// Every difference between the scratch database's dump and the patched fork's, one line
/// each, in key order.
pub fn differences(scratch: &Dump, patched: &Dump) -> Vec<String> {
    let mut out = Vec::new();
    compare(&scratch.objects, &patched.objects, "", &mut out, |a, b| {
        format!("definition differs ({})", excerpt(a, b))
    });
    let shown = |v: &Result<(u64, String), String>| match v {
        Ok((n, _)) => format!("{n} rows"),
        Err(e) => format!("unreadable: {e}"),
    };
    compare(
        &scratch.tables,
        &patched.tables,
        "rows of ",
        &mut out,
        |a, b| {
            let (a, b) = (shown(a), shown(b));
            if a == b {
                format!("contents differ ({a} on both sides)")
            } else {
                format!("scratch {a}, patched {b}")
            }
        },
    );
    compare(
        &scratch.sequences,
        &patched.sequences,
        "position of sequence ",
        &mut out,
        |a, b| format!("scratch {a}, patched {b}"),
    );
    out
}

fn compare<V: PartialEq>(
    a: &BTreeMap<String, V>,
    b: &BTreeMap<String, V>,
    label: &str,
    out: &mut Vec<String>,
    differ: impl Fn(&V, &V) -> String,
) {
    for (k, va) in a {
        match b.get(k) {
            None => out.push(format!(
                "{label}{k}: in the scratch database, missing after the patch"
            )),
            Some(vb) if vb != va => out.push(format!("{label}{k}: {}", differ(va, vb))),
            Some(_) => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        out.push(format!(
            "{label}{k}: after the patch, not in the scratch database"
        ));
    }
}

/// Where two definitions part: a little context around the first differing character.
fn excerpt(a: &str, b: &str) -> String {
    let at = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()));
    let cut = |s: &str| {
        let mut start = at.saturating_sub(30);
        while !s.is_char_boundary(start) {
            start -= 1;
        }
        let rest = &s[start.min(s.len())..];
        let piece: String = rest.chars().take(80).collect();
        let more = if rest.chars().count() > 80 { "…" } else { "" };
        format!("{}{piece}{more}", if start > 0 { "…" } else { "" })
    };
    format!("scratch: {}; patched: {}", cut(a), cut(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_each_side_and_the_place_they_part() {
        let mut a = Dump::default();
        let mut b = Dump::default();
        a.objects
            .insert("relation public.t".into(), "kind=r comment='x'".into());
        b.objects
            .insert("relation public.t".into(), "kind=r comment=-".into());
        a.objects
            .insert("column public.t.c".into(), "type=integer".into());
        b.objects
            .insert("index public.i".into(), "CREATE INDEX".into());
        a.tables.insert("public.t".into(), Ok((2, "aa".into())));
        b.tables.insert("public.t".into(), Ok((2, "bb".into())));
        a.sequences
            .insert("public.s".into(), "5 called=true".into());
        b.sequences
            .insert("public.s".into(), "5 called=true".into());
        let d = differences(&a, &b);
        assert_eq!(d.len(), 4, "{d:#?}");
        assert!(
            d[0].starts_with("column public.t.c: in the scratch database"),
            "{d:#?}"
        );
        assert!(
            d[1].contains("comment='x'") && d[1].contains("comment=-"),
            "{d:#?}"
        );
        assert!(
            d[2].starts_with("index public.i: after the patch"),
            "{d:#?}"
        );
        assert_eq!(
            d[3],
            "rows of public.t: contents differ (2 rows on both sides)"
        );
        assert!(differences(&a, &a).is_empty());
    }

    #[test]
    fn excerpt_cuts_on_char_boundaries() {
        let a = format!("{}é-left", "x".repeat(40));
        let b = format!("{}é-right", "x".repeat(40));
        let e = excerpt(&a, &b);
        assert!(e.contains("left") && e.contains("right"), "{e}");
    }
}
