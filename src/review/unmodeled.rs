//! Catalog changes the schema diff does not model: row-level security policies, rules,
//! extended statistics, default privileges, collations, operators, publications, large
//! objects, casts, text search objects, event triggers and the other rarer kinds the patch
//! check dumps; a table's storage options, row-security switches, replica identity and
//! parents (`INHERIT`, a partition's bound: the parent's queries read its rows); a
//! trigger's firing state. Each can change what the database does (a rule can turn a table's
//! inserts into nothing, a policy hides rows, a default privilege grants every future table,
//! an implicit cast changes which operator a query runs, a disabled trigger no longer
//! fires), so each is listed as a schema change, and a review never says "no changes" of a
//! database that has one. They are read as the review role on both databases, most with the
//! patch check's own canonical queries ([`super::verify::dump`]). None is carried by the
//! patch: the patch check then says "differs", and promotion refuses them
//! ([`crate::promote`]); a person applies them by hand.

use std::collections::BTreeMap;

use super::conn::{ConnError, Side};
use super::model::{Action, SchemaChange};
use super::verify::dump;

/// The dump's query kinds listed here (the schema diff models every other).
pub const KINDS: &[&str] = &[
    "policy",
    "rule",
    "statistics",
    "default privileges",
    "collation",
    "operator",
    "publication",
    "large objects",
    "cast",
    "conversion",
    "text search configuration",
    "text search dictionary",
    "text search parser",
    "text search template",
    "operator class",
    "operator family",
    "language",
    "foreign data wrapper",
    "foreign server",
    "user mapping",
    "event trigger",
    "transform",
    "access method",
];

/// The table attributes listed here, as change kinds.
pub const TABLE_KINDS: [&str; 4] = [
    "table options",
    "row security",
    "replica identity",
    "inheritance",
];

/// A trigger's firing state (`ALTER TABLE … DISABLE TRIGGER`), as a change kind: the schema
/// diff's trigger is its definition, which a disabled trigger shares with an enabled one.
pub const TRIGGER_STATE: &str = "trigger state";

/// Whether a change of `kind` is one listed here (never in the patch, never promoted).
pub fn listed_only(kind: &str) -> bool {
    KINDS.contains(&kind) || TABLE_KINDS.contains(&kind) || kind == TRIGGER_STATE
}

/// What each record says of the patch and of promotion.
pub const NOT_IN_PATCH: &str = "not in the patch: the patch check says differs and promotion \
     refuses it; apply it by hand once read";

/// The changes from the golden (`old`) to the scratch database (`new`), read inside each
/// side's snapshot.
pub async fn changes(old: &Side, new: &Side) -> Result<Vec<SchemaChange>, ConnError> {
    let old_owner = owner(old).await?;
    let new_owner = owner(new).await?;
    let before = dump::objects_of(old, &old_owner, KINDS).await?;
    let after = dump::objects_of(new, &new_owner, KINDS).await?;
    let mut out = compare_objects(&before, &after);
    out.extend(compare_attrs(
        &tables(old).await?,
        &tables(new).await?,
        TABLE_DEFAULTS,
    ));
    out.extend(compare_attrs(
        &triggers(old).await?,
        &triggers(new).await?,
        TRIGGER_DEFAULTS,
    ));
    Ok(out)
}

/// The role that owns the database's own objects (spelled `<owner>` in the dump, so the
/// golden's and the scratch database's owners compare equal under every provider): the
/// owner of schema `public`, or of the database when `public` is gone.
async fn owner(side: &Side) -> Result<String, ConnError> {
    let rows = side
        .rows(
            "SELECT COALESCE((SELECT pg_catalog.pg_get_userbyid(n.nspowner) \
             FROM pg_catalog.pg_namespace n WHERE n.nspname = 'public'), \
             (SELECT pg_catalog.pg_get_userbyid(d.datdba) FROM pg_catalog.pg_database d \
             WHERE d.datname = pg_catalog.current_database()))::pg_catalog.text",
        )
        .await?;
    Ok(rows
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .unwrap_or_default())
}

/// Dump entries added, dropped or changed, as schema changes. The kind is the key's leading
/// words (`policy public.t.p` → kind `policy`, object `public.t.p`).
fn compare_objects(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Vec<SchemaChange> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    for key in keys {
        let (b, a) = (before.get(key), after.get(key));
        let action = match (b, a) {
            (None, Some(_)) => Action::Added,
            (Some(_), None) => Action::Dropped,
            (Some(b), Some(a)) if b != a => Action::Altered,
            _ => continue,
        };
        let (kind, object) = split_key(key);
        out.push(record(kind, action, object, b.cloned(), a.cloned()));
    }
    out
}

/// A dump key's kind (the longest of [`KINDS`] it starts with: `operator class …` is not an
/// `operator`) and object name.
fn split_key(key: &str) -> (&str, &str) {
    let kind = KINDS
        .iter()
        .filter(|k| key == **k || key.starts_with(&format!("{k} ")))
        .max_by_key(|k| k.len());
    match kind {
        Some(k) => (k, key[k.len()..].trim_start()),
        None => key.split_once(' ').unwrap_or((key, "")),
    }
}

fn record(
    kind: &str,
    action: Action,
    object: &str,
    before: Option<String>,
    after: Option<String>,
) -> SchemaChange {
    SchemaChange {
        kind: kind.to_string(),
        action,
        object: object.to_string(),
        detail: NOT_IN_PATCH.to_string(),
        before,
        after,
        sql: Vec::new(),
    }
}

/// An object's attributes that the schema diff leaves out, by OID (a fork keeps the golden's
/// OIDs): qualified name, then each attribute as `(kind, value)`.
type Attrs<const N: usize> = BTreeMap<u32, (String, [(&'static str, String); N])>;

/// What a new table has unless told otherwise, per [`TABLE_KINDS`].
const TABLE_DEFAULTS: [&str; 4] = ["", "enabled=false forced=false", "default", ""];

/// What `CREATE TRIGGER` makes.
const TRIGGER_DEFAULTS: [&str; 1] = ["enabled (origin)"];

/// Tables', materialized views' and views' attributes. A view's are its options
/// (`security_barrier`, `check_option`); it has no replica identity, read as the default.
async fn tables(side: &Side) -> Result<Attrs<4>, ConnError> {
    let q = format!(
        "SELECT c.oid, pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname), \
         COALESCE(pg_catalog.array_to_string(c.reloptions, ', '), ''), \
         'enabled=' || c.relrowsecurity || ' forced=' || c.relforcerowsecurity, \
         CASE WHEN c.relkind = 'v' THEN 'default' WHEN c.relreplident = 'd' THEN 'default' \
           WHEN c.relreplident = 'n' THEN 'nothing' \
           WHEN c.relreplident = 'f' THEN 'full' WHEN c.relreplident = 'i' THEN 'index' \
           ELSE c.relreplident::pg_catalog.text END, \
         COALESCE((SELECT pg_catalog.string_agg(i.inhparent::pg_catalog.regclass::pg_catalog.text, ', ' \
           ORDER BY i.inhseqno) FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid), '') \
         || CASE WHEN c.relispartition THEN ' partition ' \
           || COALESCE(pg_catalog.pg_get_expr(c.relpartbound, c.oid), '') ELSE '' END \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p', 'm', 'v') AND c.relpersistence <> 't' AND {} AND {}",
        dump::user_ns("n"),
        dump::no_ext("pg_class", "c.oid")
    );
    read_attrs(side, &q, TABLE_KINDS).await
}

/// Triggers' firing states.
async fn triggers(side: &Side) -> Result<Attrs<1>, ConnError> {
    let q = format!(
        "SELECT t.oid, pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) \
         || '.' || pg_catalog.quote_ident(t.tgname), \
         CASE t.tgenabled WHEN 'O' THEN 'enabled (origin)' WHEN 'D' THEN 'disabled' \
           WHEN 'R' THEN 'enabled (replica only)' WHEN 'A' THEN 'enabled (always)' \
           ELSE t.tgenabled::pg_catalog.text END \
         FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE NOT t.tgisinternal AND {} AND {}",
        dump::user_ns("n"),
        dump::no_ext("pg_class", "c.oid")
    );
    read_attrs(side, &q, [TRIGGER_STATE]).await
}

/// Rows of `q` (OID, qualified name, then one column per kind of `kinds`) as [`Attrs`].
async fn read_attrs<const N: usize>(
    side: &Side,
    q: &str,
    kinds: [&'static str; N],
) -> Result<Attrs<N>, ConnError> {
    let text = |v: Option<&Option<String>>| v.cloned().flatten().unwrap_or_default();
    Ok(side
        .rows(q)
        .await?
        .iter()
        .filter_map(|r| {
            let oid = r.first()?.as_deref()?.parse().ok()?;
            let attrs = std::array::from_fn(|i| (kinds[i], text(r.get(i + 2))));
            Some((oid, (text(r.get(1)), attrs)))
        })
        .collect())
}

/// Changed attributes of objects on both sides, and attributes a new object has other than
/// `defaults` (the patch creates it with the defaults).
fn compare_attrs<const N: usize>(
    before: &Attrs<N>,
    after: &Attrs<N>,
    defaults: [&str; N],
) -> Vec<SchemaChange> {
    let mut out = Vec::new();
    for (oid, (name, attrs)) in after {
        match before.get(oid) {
            Some((_, old)) => {
                for ((kind, b), (_, a)) in old.iter().zip(attrs) {
                    if a != b {
                        out.push(record(
                            kind,
                            Action::Altered,
                            name,
                            Some(b.clone()),
                            Some(a.clone()),
                        ));
                    }
                }
            }
            None => {
                for ((kind, a), default) in attrs.iter().zip(defaults) {
                    if a != default {
                        out.push(record(kind, Action::Added, name, None, Some(a.clone())));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn objects_added_dropped_and_changed_are_each_a_change() {
        let before = map(&[
            ("policy public.t.p", "command=* using=true"),
            ("rule public.t.r", "CREATE RULE r AS …"),
            ("large objects", "count=0"),
            ("statistics public.s", "CREATE STATISTICS …"),
        ]);
        let after = map(&[
            ("policy public.t.p", "command=* using=false"),
            ("large objects", "count=1"),
            ("statistics public.s", "CREATE STATISTICS …"),
            (
                "default privileges of <owner> in * on r",
                "PUBLIC=SELECT/<owner>",
            ),
        ]);
        let got: Vec<(String, Action, String)> = compare_objects(&before, &after)
            .into_iter()
            .map(|c| (c.kind, c.action, c.object))
            .collect();
        let want = [
            ("default privileges", Action::Added, "of <owner> in * on r"),
            ("large objects", Action::Altered, ""),
            ("policy", Action::Altered, "public.t.p"),
            ("rule", Action::Dropped, "public.t.r"),
        ];
        let want: Vec<(String, Action, String)> = want
            .iter()
            .map(|(k, a, o)| (k.to_string(), *a, o.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn table_attributes_compare_by_oid_and_a_new_table_by_the_defaults() {
        let t = |name: &str, opts: &str, rls: &str, ri: &str| {
            (
                name.to_string(),
                [
                    ("table options", opts.to_string()),
                    ("row security", rls.to_string()),
                    ("replica identity", ri.to_string()),
                    ("inheritance", String::new()),
                ],
            )
        };
        let mut before = Attrs::<4>::new();
        before.insert(1, t("public.a", "", TABLE_DEFAULTS[1], "default"));
        before.insert(2, t("public.b", "", TABLE_DEFAULTS[1], "default"));
        let mut after = Attrs::<4>::new();
        // Renamed (same OID) and given options: one change, under the new name.
        after.insert(
            1,
            t("public.a2", "fillfactor=50", TABLE_DEFAULTS[1], "default"),
        );
        after.insert(2, t("public.b", "", "enabled=true forced=false", "full"));
        after.insert(3, t("public.c", "", TABLE_DEFAULTS[1], "default"));
        after.insert(
            4,
            t(
                "public.d",
                "autovacuum_enabled=false",
                TABLE_DEFAULTS[1],
                "nothing",
            ),
        );
        let got: Vec<(String, Action, String, Option<String>)> =
            compare_attrs(&before, &after, TABLE_DEFAULTS)
                .into_iter()
                .map(|c| (c.kind, c.action, c.object, c.after))
                .collect();
        let s = |x: &str| Some(x.to_string());
        let want = vec![
            (
                "table options".into(),
                Action::Altered,
                "public.a2".into(),
                s("fillfactor=50"),
            ),
            (
                "row security".into(),
                Action::Altered,
                "public.b".into(),
                s("enabled=true forced=false"),
            ),
            (
                "replica identity".into(),
                Action::Altered,
                "public.b".into(),
                s("full"),
            ),
            (
                "table options".into(),
                Action::Added,
                "public.d".into(),
                s("autovacuum_enabled=false"),
            ),
            (
                "replica identity".into(),
                Action::Added,
                "public.d".into(),
                s("nothing"),
            ),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn every_kind_here_is_a_query_kind_of_the_dump_and_splits_off_its_key() {
        let dumped = dump::query_kinds();
        for k in KINDS {
            assert!(
                dumped.contains(k),
                "{k} is not a kind of the dump's queries"
            );
            let key = format!("{k} x.y");
            let (kind, object) = split_key(&key);
            assert_eq!((kind, object), (*k, "x.y"));
            assert_eq!(split_key(k), (*k, ""));
        }
    }
}
