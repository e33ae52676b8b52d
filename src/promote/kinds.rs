//! Change kinds promoted as the review's own patch statements (kept with each change by the
//! schema diff, built from the catalog, never from the agent's SQL): renames (run before
//! the row guards, so rows are found under their new names), altered columns, views,
//! comments, grants, schemas, sequence parameters, changed indexes and constraints, dropped
//! triggers and functions — and the
//! kinds refused with the reason a person reads before approving: functions and triggers
//! the task adds or changes (their bodies are agent code the target would run, a trigger on
//! the promotion's own row changes), types, extensions, materialized views.

use super::names;
use super::plan_model::{Plan, SchemaGuard, Want};
use crate::review::model::{Action, SchemaChange};
use crate::review::sql::order;
use crate::review::unmodeled;

/// Where a kind handled here goes.
pub enum Placed {
    /// Statements (with their patch order) for before and after the row changes.
    Stmts(Vec<(u32, String)>),
    /// Renames: run before the row guards.
    Renames,
    /// Not promoted, with the reason.
    Refused(String),
}

const BODY: &str = "its body is agent code that the target would run (read it in the review \
     and create it by hand if it is wanted); not promoted";

/// What to do with `c` (a kind not handled by [`super::plan::build`] itself).
pub fn place(c: &SchemaChange) -> Placed {
    use Action::*;
    let materialized = c
        .sql
        .iter()
        .any(|(_, s)| s.starts_with("CREATE MATERIALIZED"));
    match (c.kind.as_str(), c.action) {
        ("view", _) if materialized => Placed::Refused(
            "a materialized view runs its query on the target when it is created; not promoted"
                .into(),
        ),
        // A renamed view is dropped and created again, like a changed one.
        ("view", Renamed) => Placed::Stmts(c.sql.clone()),
        // A new schema goes with the renames: a table may be moved into it.
        (_, Renamed) | ("schema", Added) => Placed::Renames,
        ("function", Added | Altered) => Placed::Refused(format!("a function: {BODY}")),
        ("trigger", Added | Altered) => Placed::Refused(format!(
            "a trigger runs its function on every matching row change, the promotion's own \
             included, and {BODY}"
        )),
        ("type", _) => Placed::Refused(
            "types and domains are not promoted (apply the reviewed patch by hand)".into(),
        ),
        ("extension", _) => Placed::Refused(
            "an extension runs its install script on the target; not promoted".into(),
        ),
        ("column", Altered) if c.detail.contains("identity/generation changed") => {
            Placed::Refused("a change of identity or generation is not promoted".into())
        }
        (
            "column" | "view" | "comment" | "grant" | "schema" | "sequence" | "table",
            Added | Altered | Dropped,
        )
        | ("trigger" | "function", Dropped)
        | ("index" | "constraint", Altered) => {
            if c.sql.is_empty() {
                Placed::Refused(
                    "the review holds no statement for it (a review stored before promotion \
                     kept them); not promoted"
                        .into(),
                )
            } else {
                Placed::Stmts(c.sql.clone())
            }
        }
        (k, _) if unmodeled::listed_only(k) => Placed::Refused(
            "listed by the review but not in its patch (a policy, rule, default privilege, \
             table option and the like changes what the target does for every later user); \
             not promoted: apply it by hand once read"
                .into(),
        ),
        _ => Placed::Refused(
            "this kind of schema change is not promoted (apply the reviewed patch by hand)".into(),
        ),
    }
}

/// The old name of a renamed object, as the review says it (`was <name>`).
fn was(c: &SchemaChange) -> Option<&str> {
    c.detail.strip_prefix("was ")
}

/// Guards of a change handled here: what the target must hold before it applies.
pub fn guards(c: &SchemaChange, plan: &mut Plan) {
    // A renamed column needs none: its ALTER fails (and nothing applies) if it is gone, and
    // its values are guarded row by row under the new name.
    let mut add = |kind: &str, object: String, want: Want, renames: bool| {
        let g = SchemaGuard {
            kind: kind.into(),
            object,
            want,
        };
        if renames {
            plan.rename_guards.push(g)
        } else {
            plan.schema_guards.push(g)
        }
    };
    match (c.kind.as_str(), c.action) {
        ("table", Action::Renamed) => {
            if let Some(old) = was(c) {
                add("table", old.to_string(), Want::Exists, true);
                add("table", c.object.clone(), Want::Absent, true);
            }
        }
        ("column", Action::Altered) => {
            let col = names::parent_and_last(&c.object).map(|(_, k)| k.quoted);
            let want = match (&c.before, col) {
                // Renamed as well: the golden's definition names the old column.
                (Some(b), Some(col)) if b.starts_with(&format!("{col} ")) => Want::Def(b.clone()),
                _ => Want::Exists,
            };
            add("column", c.object.clone(), want, false);
        }
        ("view", Action::Added) => add("view", c.object.clone(), Want::Absent, false),
        ("index" | "constraint", Action::Altered) => {
            if let Some(b) = &c.before {
                add(&c.kind, c.object.clone(), Want::Def(b.clone()), false)
            }
        }
        ("view", Action::Dropped) => {
            if let Some(b) = &c.before {
                add("view", c.object.clone(), Want::Def(b.clone()), false)
            }
        }
        _ => {}
    }
}

/// Whether a patch statement runs after the row changes.
pub fn after_data(order_no: u32) -> bool {
    order_no > order::DATA
}

/// Positions of the columns of `table` whose type the review changes (their values are
/// compared with the golden's before the change only).
pub fn type_changed(review: &crate::review::model::Review, table: &str) -> Vec<String> {
    review
        .schema
        .iter()
        .filter(|c| c.kind == "column" && c.action == Action::Altered)
        .filter(|c| c.detail.starts_with("type ") || c.detail.contains("; type "))
        .filter_map(|c| names::parent_and_last(&c.object))
        .filter(|(t, _)| t == table)
        .map(|(_, k)| k.quoted)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(kind: &str, action: Action, sql: &[(u32, &str)]) -> SchemaChange {
        SchemaChange {
            kind: kind.into(),
            action,
            object: "public.t.c".into(),
            detail: "was d".into(),
            before: None,
            after: None,
            sql: sql.iter().map(|(o, s)| (*o, s.to_string())).collect(),
        }
    }

    #[test]
    fn each_kind_is_taken_whole_renamed_or_refused_with_a_reason() {
        type Case<'a> = (&'a str, Action, &'a [(u32, &'a str)], &'a str);
        let cases: &[Case] = &[
            ("column", Action::Renamed, &[(21, "ALTER …")], "renames"),
            ("table", Action::Renamed, &[(20, "ALTER …")], "renames"),
            ("column", Action::Altered, &[(26, "ALTER …")], "stmts"),
            ("view", Action::Added, &[(104, "CREATE VIEW …")], "stmts"),
            (
                "view",
                Action::Added,
                &[(104, "CREATE MATERIALIZED VIEW …")],
                "materialized",
            ),
            (
                "view",
                Action::Renamed,
                &[(10, "DROP VIEW …"), (104, "CREATE VIEW …")],
                "stmts",
            ),
            (
                "schema",
                Action::Added,
                &[(1, "CREATE SCHEMA …")],
                "renames",
            ),
            ("comment", Action::Added, &[(108, "COMMENT …")], "stmts"),
            ("grant", Action::Dropped, &[(109, "REVOKE …")], "stmts"),
            (
                "trigger",
                Action::Dropped,
                &[(11, "DROP TRIGGER …")],
                "stmts",
            ),
            (
                "trigger",
                Action::Added,
                &[(105, "CREATE TRIGGER …")],
                "every matching row",
            ),
            ("function", Action::Added, &[(6, "CREATE …")], "agent code"),
            (
                "function",
                Action::Altered,
                &[(6, "CREATE …")],
                "agent code",
            ),
            (
                "type",
                Action::Added,
                &[(4, "CREATE TYPE …")],
                "types and domains",
            ),
            (
                "extension",
                Action::Added,
                &[(3, "CREATE EXTENSION …")],
                "install script",
            ),
            ("view", Action::Added, &[], "no statement"),
            ("policy", Action::Added, &[], "not in its patch"),
            ("rule", Action::Dropped, &[], "not in its patch"),
            ("default privileges", Action::Added, &[], "not in its patch"),
            ("row security", Action::Altered, &[], "not in its patch"),
            ("large objects", Action::Altered, &[], "not in its patch"),
            ("trigger state", Action::Altered, &[], "not in its patch"),
        ];
        for (kind, action, sql, want) in cases {
            let got = match place(&change(kind, *action, sql)) {
                Placed::Stmts(s) => {
                    assert_eq!(s.len(), sql.len());
                    "stmts".to_string()
                }
                Placed::Renames => "renames".into(),
                Placed::Refused(why) => why,
            };
            assert!(got.contains(want), "{kind} {action:?}: {got}");
        }
        assert!(after_data(order::COMMENT) && !after_data(order::DROP_VIEW));
    }
}
