//! Nothing the agent wrote runs on the target: every expression a promotion would make the
//! target evaluate (column defaults and generated columns, CHECK and exclusion constraints,
//! index expressions and predicates, domain checks of the columns it creates or alters; views
//! it creates, which run when read) is checked in
//! the scratch database's catalog while the token ends. `pg_depend` records which functions,
//! operators and operator classes an expression uses; each must be built in (OID below
//! [`FIRST_NORMAL_OID`]) and free of side effects: immutable or stable, or one of a few
//! volatile functions that only produce a value, and never on [`DENIED`]. `nextval` is
//! allowed only of a sequence named by a constant (recorded as a dependency), which is one
//! the change creates or the golden had. The catalog is read as the review's login
//! (never a superuser) with the search path pinned; catalog reads run no user code.

use super::names;
use crate::review::conn::{literal, ConnError, Side};
use crate::review::model::{Action, Review, SchemaChange};

/// OIDs below this are the server's own objects (`FirstNormalObjectId`).
pub const FIRST_NORMAL_OID: u32 = 16384;

/// Built-in functions with side effects (or that run SQL given as text), refused whatever
/// their volatility says; a trailing `*` is a prefix.
pub const DENIED: &[&str] = &[
    "pg_notify",
    "lo_*",
    "be_lo_*",
    "set_config",
    "pg_advisory*",
    "pg_try_advisory*",
    "dblink*",
    "pg_sleep*",
    "pg_read_file",
    "pg_read_binary_file",
    "pg_ls_*",
    "pg_stat_file",
    "pg_stat_reset*",
    "txid_*",
    "pg_current_xact*",
    "pg_xact_*",
    "setval",
    "currval",
    "lastval",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_reload_conf",
    "pg_rotate_logfile",
    "pg_create_*",
    "pg_drop_*",
    "pg_logical_emit_message",
    "pg_switch_wal",
    "pg_promote",
    "pg_export_snapshot",
    "pg_replication_*",
    "pg_log_backend_memory_contexts",
    "pg_import_system_collations",
    "query_to_xml*",
    "table_to_xml*",
    "cursor_to_xml*",
    "schema_to_xml*",
    "database_to_xml*",
    "ts_stat",
    "ts_rewrite",
];

/// Volatile built-ins that only produce a value (common in defaults).
const VOLATILE_OK: &[&str] = &[
    "gen_random_uuid",
    "random",
    "clock_timestamp",
    "statement_timestamp",
    "timeofday",
];

/// Whether built-in function `name` is on [`DENIED`].
pub fn denied(name: &str) -> bool {
    DENIED.iter().any(|d| match d.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *d,
    })
}

/// One thing an expression depends on, as the catalog says.
#[derive(Debug, Clone, PartialEq)]
pub struct Dep {
    /// Which expression: `default of column public.t.c: nextval(…)`.
    pub expression: String,
    /// function, operator, operator class, sequence (others are ignored).
    pub kind: String,
    /// Its OID.
    pub oid: u32,
    /// Its name, with arguments for a function.
    pub name: String,
    /// provolatile of the function (of the operator's function for an operator).
    pub volatility: String,
    /// The function's name (the operator's function for an operator) without arguments.
    pub proname: String,
    /// OID of the operator's function.
    pub code_oid: u32,
}

/// Why `deps` may not run on the target, one line per expression and reason.
pub fn judge(deps: &[Dep]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |s: String| {
        if !out.contains(&s) {
            out.push(s)
        }
    };
    for d in deps {
        let refuse = |why: String| format!("{}: {why}; not promoted", d.expression);
        match d.kind.as_str() {
            "function" | "operator" => {
                let what = format!("{} {}", d.kind, d.name);
                if d.oid >= FIRST_NORMAL_OID || d.code_oid >= FIRST_NORMAL_OID {
                    push(refuse(format!(
                        "calls {what}, which is not built in (agent-defined code never runs on the target)"
                    )));
                } else if denied(&d.proname) {
                    push(refuse(format!("calls {what}, which has side effects")));
                } else if d.proname == "nextval" {
                    if !deps
                        .iter()
                        .any(|x| x.expression == d.expression && x.kind == "sequence")
                    {
                        push(refuse(
                            "calls nextval of a sequence not named by a constant".into(),
                        ));
                    }
                } else if d.volatility == "v" && !VOLATILE_OK.contains(&d.proname.as_str()) {
                    push(refuse(format!(
                        "calls {what}, which is volatile (may have side effects)"
                    )));
                }
            }
            "operator class" if d.oid >= FIRST_NORMAL_OID => push(refuse(format!(
                "uses operator class {}, which is not built in",
                d.name
            ))),
            _ => {}
        }
    }
    out
}

/// SELECTs of (expression label, catalog, object OID) for what `c` makes the target
/// evaluate, over the scratch catalog.
fn roots(c: &SchemaChange) -> Vec<String> {
    let attrdef = |rel: &str, col_filter: &str| {
        format!(
            "SELECT 'default of column ' || {lbl} || '.' || pg_catalog.quote_ident(a.attname) || ': ' || \
             pg_catalog.pg_get_expr(d.adbin, d.adrelid), 'pg_catalog.pg_attrdef'::pg_catalog.regclass, d.oid, \
             d.adbin::pg_catalog.text \
             FROM pg_catalog.pg_attrdef d JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid \
             AND a.attnum = d.adnum WHERE d.adrelid = pg_catalog.to_regclass({rel}){col_filter}",
            lbl = literal(&names::plain(rel)),
            rel = literal(rel)
        )
    };
    let constraint = |rel: &str, filter: &str| {
        format!(
            "SELECT 'constraint ' || {lbl} || '.' || pg_catalog.quote_ident(k.conname) || ': ' || \
             pg_catalog.pg_get_constraintdef(k.oid), 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid, \
             COALESCE(k.conbin::pg_catalog.text, '') || ' :opnos (o ' || \
             pg_catalog.array_to_string(COALESCE(k.conexclop, '{{}}'), ' ') || ')' \
             FROM pg_catalog.pg_constraint k WHERE k.conrelid = pg_catalog.to_regclass({rel}){filter}",
            lbl = literal(&names::plain(rel)),
            rel = literal(rel)
        )
    };
    let index = |filter: &str| {
        format!(
            "SELECT 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid), 'pg_catalog.pg_class'::pg_catalog.regclass, \
             i.indexrelid, COALESCE(i.indexprs::pg_catalog.text, '') || ' ' || COALESCE(i.indpred::pg_catalog.text, '') \
             FROM pg_catalog.pg_index i WHERE {filter}"
        )
    };
    let domains = |rel: &str, col_filter: &str| {
        format!(
            "SELECT 'check of domain ' || pg_catalog.format_type(t.oid, NULL) || ': ' || \
             pg_catalog.pg_get_constraintdef(k.oid), 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid, \
             COALESCE(k.conbin::pg_catalog.text, '') \
             FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             JOIN pg_catalog.pg_constraint k ON k.contypid = t.oid \
             WHERE a.attrelid = pg_catalog.to_regclass({rel}) AND a.attnum > 0 AND NOT a.attisdropped{col_filter}",
            rel = literal(rel)
        )
    };
    match (c.kind.as_str(), c.action) {
        ("table", Action::Added) => {
            let rel = c.object.as_str();
            let reg = format!("pg_catalog.to_regclass({})", literal(rel));
            vec![
                attrdef(rel, ""),
                constraint(rel, ""),
                index(&format!("i.indrelid = {reg}")),
                domains(rel, ""),
            ]
        }
        ("view", Action::Added | Action::Altered | Action::Renamed) => vec![format!(
            "SELECT 'view ' || {lbl}, 'pg_catalog.pg_rewrite'::pg_catalog.regclass, r.oid, \
             r.ev_action::pg_catalog.text FROM pg_catalog.pg_rewrite r \
             WHERE r.ev_class = pg_catalog.to_regclass({rel})",
            lbl = literal(&c.object),
            rel = literal(&c.object)
        )],
        ("column", Action::Added | Action::Altered) => match names::parent_and_last(&c.object) {
            Some((rel, col)) => {
                let f = format!(" AND a.attname = {}", literal(&col.plain));
                vec![attrdef(&rel, &f), domains(&rel, &f)]
            }
            None => Vec::new(),
        },
        ("constraint", Action::Added | Action::Altered) => {
            match names::parent_and_last(&c.object) {
                Some((rel, k)) => {
                    vec![constraint(
                        &rel,
                        &format!(" AND k.conname = {}", literal(&k.plain)),
                    )]
                }
                None => Vec::new(),
            }
        }
        ("index", Action::Added | Action::Altered) => vec![index(&format!(
            "i.indexrelid = pg_catalog.to_regclass({})",
            literal(&c.object)
        ))],
        _ => Vec::new(),
    }
}

/// OIDs of the functions and operators a stored expression tree (`pg_node_tree` text)
/// calls: `pg_depend` records no dependency on the server's own (pinned) objects, so
/// built-ins are found here, in every field that names one.
pub fn tree_oids(tree: &str) -> (Vec<u32>, Vec<u32>) {
    const FUNCS: &[&str] = &[
        ":funcid ",
        ":opfuncid ",
        ":hashfuncid ",
        ":negfuncid ",
        ":aggfnoid ",
        ":winfnoid ",
    ];
    let number = |rest: &str| -> Option<u32> {
        let d: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        d.parse().ok().filter(|n| *n != 0)
    };
    let mut funcs = Vec::new();
    let mut ops = Vec::new();
    for f in FUNCS {
        funcs.extend(
            tree.match_indices(f)
                .filter_map(|(i, _)| number(&tree[i + f.len()..])),
        );
    }
    ops.extend(
        tree.match_indices(":opno ")
            .filter_map(|(i, _)| number(&tree[i + 6..])),
    );
    // Lists of operators (row comparisons, exclusion constraints): `:opnos (o 96 97)`.
    for (i, _) in tree.match_indices(":opnos (o") {
        let rest = &tree[i + 9..];
        let list = rest.split(')').next().unwrap_or("");
        ops.extend(list.split_whitespace().filter_map(number));
    }
    funcs.sort_unstable();
    funcs.dedup();
    ops.sort_unstable();
    ops.dedup();
    (funcs, ops)
}

fn oid_array(v: &[u32]) -> String {
    let s: Vec<String> = v.iter().map(u32::to_string).collect();
    format!("'{{{}}}'::pg_catalog.oid[]", s.join(","))
}

/// The dependencies of every expression of `review`'s added objects, read from the scratch
/// database through `side`: what `pg_depend` records (user objects, sequences named by a
/// constant, operator classes) and the built-ins named in the expression trees.
pub async fn dependencies(side: &Side, review: &Review) -> Result<Vec<Dep>, ConnError> {
    let parts: Vec<String> = review.schema.iter().flat_map(roots).collect();
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    let roots = format!(
        "WITH roots(label, classid, objid, tree) AS ({})",
        parts.join(" UNION ALL ")
    );
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    let mut out = Vec::new();
    let trees = side
        .rows(&format!("{roots} SELECT label, tree FROM roots"))
        .await?;
    for t in &trees {
        let (funcs, ops) = tree_oids(&text(&t[1]));
        let q = format!(
            "SELECT 'function', p.oid::pg_catalog.int8::pg_catalog.text, p.oid::pg_catalog.regprocedure::pg_catalog.text, \
               p.provolatile::pg_catalog.text, p.proname::pg_catalog.text, '0' \
             FROM pg_catalog.pg_proc p WHERE p.oid = ANY({f}) \
             UNION ALL SELECT 'operator', o.oid::pg_catalog.int8::pg_catalog.text, o.oid::pg_catalog.regoperator::pg_catalog.text, \
               COALESCE(p.provolatile::pg_catalog.text, ''), COALESCE(p.proname::pg_catalog.text, ''), \
               o.oprcode::pg_catalog.oid::pg_catalog.int8::pg_catalog.text \
             FROM pg_catalog.pg_operator o LEFT JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode \
             WHERE o.oid = ANY({o})",
            f = oid_array(&funcs),
            o = oid_array(&ops)
        );
        for r in side.rows(&q).await? {
            out.push(Dep {
                expression: text(&t[0]),
                kind: text(&r[0]),
                oid: text(&r[1]).parse().unwrap_or(u32::MAX),
                name: text(&r[2]),
                volatility: text(&r[3]),
                proname: text(&r[4]),
                code_oid: text(&r[5]).parse().unwrap_or(u32::MAX),
            });
        }
    }
    let q = format!(
        "{roots} SELECT r.label, CASE d.refclassid \
             WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN 'function' \
             WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass THEN 'operator' \
             WHEN 'pg_catalog.pg_opclass'::pg_catalog.regclass THEN 'operator class' \
             WHEN 'pg_catalog.pg_class'::pg_catalog.regclass THEN \
               CASE WHEN s.relkind = 'S' THEN 'sequence' ELSE 'relation' END \
             ELSE 'other' END, \
           d.refobjid::pg_catalog.int8::pg_catalog.text, \
           COALESCE(p.oid::pg_catalog.regprocedure::pg_catalog.text, o.oid::pg_catalog.regoperator::pg_catalog.text, \
             oc.opcname::pg_catalog.text, s.relname::pg_catalog.text, ''), \
           COALESCE(p.provolatile, op.provolatile, '')::pg_catalog.text, \
           COALESCE(p.proname, op.proname, '')::pg_catalog.text, \
           COALESCE(o.oprcode::pg_catalog.oid::pg_catalog.int8, 0)::pg_catalog.text \
         FROM roots r JOIN pg_catalog.pg_depend d ON d.classid = r.classid AND d.objid = r.objid \
         LEFT JOIN pg_catalog.pg_proc p ON d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND p.oid = d.refobjid \
         LEFT JOIN pg_catalog.pg_operator o ON d.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass AND o.oid = d.refobjid \
         LEFT JOIN pg_catalog.pg_proc op ON op.oid = o.oprcode \
         LEFT JOIN pg_catalog.pg_opclass oc ON d.refclassid = 'pg_catalog.pg_opclass'::pg_catalog.regclass AND oc.oid = d.refobjid \
         LEFT JOIN pg_catalog.pg_class s ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND s.oid = d.refobjid \
         ORDER BY 1, 2, 3"
    );
    for r in side.rows(&q).await? {
        out.push(Dep {
            expression: text(&r[0]),
            kind: text(&r[1]),
            oid: text(&r[2]).parse().unwrap_or(u32::MAX),
            name: text(&r[3]),
            volatility: text(&r[4]),
            proname: text(&r[5]),
            code_oid: text(&r[6]).parse().unwrap_or(u32::MAX),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(kind: &str, oid: u32, proname: &str, vol: &str) -> Dep {
        Dep {
            expression: "constraint public.t.k: CHECK (…)".into(),
            kind: kind.into(),
            oid,
            name: format!("{proname}(text)"),
            volatility: vol.into(),
            proname: proname.into(),
            code_oid: 0,
        }
    }

    #[test]
    fn tree_oids_finds_functions_and_operators_in_every_field() {
        let tree = "{OPEXPR :opno 96 :opfuncid 65 :opresulttype 16 :args ({FUNCEXPR :funcid 3036 \
                    :funcresulttype 2278 :args <>} {CONST :consttype 23})} \
                    {ROWCOMPAREEXPR :opnos (o 97 521) :opfamilies (o 1976)} :opnos (o )";
        let (f, o) = tree_oids(tree);
        assert_eq!(f, vec![65, 3036]);
        assert_eq!(o, vec![96, 97, 521]);
        assert_eq!(tree_oids(""), (vec![], vec![]));
    }

    #[test]
    fn only_built_in_side_effect_free_code_passes() {
        let cases: &[(Vec<Dep>, Option<&str>)] = &[
            (vec![dep("function", 870, "lower", "i")], None),
            (vec![dep("function", 1299, "now", "s")], None),
            (vec![dep("function", 3432, "gen_random_uuid", "v")], None),
            (
                vec![dep("function", 3036, "pg_notify", "v")],
                Some("side effects"),
            ),
            (
                vec![dep("function", 1, "lo_from_bytea", "v")],
                Some("side effects"),
            ),
            (
                vec![dep("function", 2, "set_config", "v")],
                Some("side effects"),
            ),
            (
                vec![dep("function", 3, "pg_advisory_xact_lock", "v")],
                Some("side effects"),
            ),
            // Denied even when marked immutable.
            (
                vec![dep("function", 4, "pg_notify", "i")],
                Some("side effects"),
            ),
            (
                vec![dep("function", 16400, "my_func", "i")],
                Some("not built in"),
            ),
            (
                vec![dep("operator", 16401, "int4eq", "i")],
                Some("not built in"),
            ),
            (
                vec![Dep {
                    code_oid: 16402,
                    ..dep("operator", 96, "my_eq", "i")
                }],
                Some("not built in"),
            ),
            (
                vec![dep("function", 1574, "nextval", "v")],
                Some("not named by a constant"),
            ),
            (
                vec![
                    dep("function", 1574, "nextval", "v"),
                    dep("sequence", 16500, "", ""),
                ],
                None,
            ),
            (vec![dep("function", 5, "clock_timestamp", "v")], None),
            // dblink is an extension (OID past the built-ins), and denied by name besides.
            (
                vec![dep("function", 7, "dblink_exec", "v")],
                Some("side effects"),
            ),
            (
                vec![dep("function", 8, "pg_sleep", "v")],
                Some("side effects"),
            ),
            (
                vec![dep("function", 9, "query_to_xml", "s")],
                Some("side effects"),
            ),
            (
                vec![dep("function", 6, "pg_backend_pid", "v")],
                Some("volatile"),
            ),
            (
                vec![dep("operator class", 16403, "", "")],
                Some("operator class"),
            ),
        ];
        for (deps, want) in cases {
            let got = judge(deps);
            match want {
                None => assert!(got.is_empty(), "{deps:?}: {got:?}"),
                Some(w) => assert!(
                    got.len() == 1
                        && got[0].contains(w)
                        && got[0].contains("constraint public.t.k"),
                    "{deps:?}: {got:?}"
                ),
            }
        }
    }
}
