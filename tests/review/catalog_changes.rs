//! Catalog changes the review's schema diff does not model (policies, rules, statistics,
//! default privileges, publications, large objects, a table's options, row security and
//! replica identity, inheritance, a trigger's firing state): each is listed as a schema change, so the
//! review never says "no changes" of a database that has them; none is in the patch, so
//! the patch check says "differs" and promotion refuses them.

use std::collections::BTreeSet;

use super::diffs::{diff, gateway, get_text, run_sql, schema_of};

fn s3(a: &str, b: &str, c: &str) -> (String, String, String) {
    (a.into(), b.into(), c.into())
}

#[test]
fn catalog_only_changes_are_listed_and_never_patched() {
    let g = gateway();
    let t = g.issue("catalog-only", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(
        t["dsn"].as_str().expect("dsn"),
        "create rule items_no_insert as on insert to items do instead nothing;\n\
         alter table order_lines enable row level security;\n\
         create policy hide_all on order_lines using (false);\n\
         create statistics items_stats on id, name from items;\n\
         alter default privileges grant select on tables to public;\n\
         select lo_from_bytea(0, 'kept out of the patch');\n\
         alter table events set (fillfactor = 50);\n\
         alter table audit replica identity full;\n\
         create table fresh(a int) with (autovacuum_enabled = false);\n\
         alter table order_lines disable trigger order_lines_touch;\n\
         create trigger fresh_touch before insert on fresh for each row \
           execute function order_lines_touch();\n\
         alter table fresh disable trigger fresh_touch;\n\
         create type money2 as (units bigint);\n\
         create function money2_text(money2) returns text language sql immutable \
           as 'select ($1).units::text';\n\
         create cast (money2 as text) with function money2_text(money2) as implicit;\n\
         create text search configuration public.plain (copy = pg_catalog.simple);\n\
         create table kid () inherits (events);\n\
         alter view cheap_items set (security_barrier = true);\n",
    );
    let r = diff(g, &id);
    let got: BTreeSet<_> = schema_of(&r).into_iter().collect();
    for want in [
        s3("rule", "added", "public.items.items_no_insert"),
        s3("row security", "altered", "public.order_lines"),
        s3("policy", "added", "public.order_lines.hide_all"),
        s3("statistics", "added", "public.items_stats"),
        s3("default privileges", "added", "of <owner> in * on r"),
        s3("large objects", "altered", ""),
        s3("table options", "altered", "public.events"),
        s3("replica identity", "altered", "public.audit"),
        s3("table", "added", "public.fresh"),
        s3("table options", "added", "public.fresh"),
        s3(
            "trigger state",
            "altered",
            "public.order_lines.order_lines_touch",
        ),
        s3("trigger", "added", "public.fresh.fresh_touch"),
        s3("trigger state", "added", "public.fresh.fresh_touch"),
        s3("cast", "added", "public.money2 as text"),
        s3("text search configuration", "added", "public.plain"),
        s3("inheritance", "added", "public.kid"),
        s3("table options", "altered", "public.cheap_items"),
    ] {
        assert!(got.contains(&want), "{want:?} missing from {got:#?}");
    }
    let listed: Vec<_> = r["schema"]
        .as_array()
        .expect("schema")
        .iter()
        .filter(|c| sandpit::review::unmodeled::listed_only(c["kind"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(listed.len(), 15, "{listed:#?}");
    for c in &listed {
        assert!(
            c.get("sql").is_none(),
            "a listed-only change has patch SQL: {c}"
        );
        assert!(
            c["detail"]
                .as_str()
                .unwrap_or("")
                .contains("not in the patch"),
            "{c}"
        );
    }
    let patch = r["patch"].as_str().unwrap_or("");
    for word in [
        "RULE",
        "POLICY",
        "STATISTICS",
        "DEFAULT PRIVILEGES",
        "fillfactor",
        "REPLICA",
    ] {
        assert!(!patch.contains(word), "the patch carries {word}:\n{patch}");
    }
    assert!(
        r["notes"]
            .to_string()
            .contains("15 catalog change(s) of kinds the patch does not carry"),
        "{}",
        r["notes"]
    );
    let (s, text) = get_text(g, &format!("/v1/tokens/{id}/diff?format=text&verify=true"));
    assert_eq!(s, 200, "{text}");
    assert!(!text.contains("no changes against the golden"), "{text}");
    assert!(text.contains("patch verified: differs"), "{text}");
    // The patch check's own dump has the rarer kinds too: the cast is one of its differences.
    assert!(text.contains("cast public.money2 as text"), "{text}");
    g.revoke(&id);
}

#[test]
fn a_database_without_such_changes_lists_none() {
    let g = gateway();
    let t = g.issue("catalog-only-none", 600);
    let id = t["id"].as_str().expect("id").to_string();
    run_sql(
        t["dsn"].as_str().expect("dsn"),
        "update items set name = name || '!' where id = 1;\n",
    );
    let r = diff(g, &id);
    assert_eq!(schema_of(&r), vec![], "{r:#}");
    g.revoke(&id);
}
