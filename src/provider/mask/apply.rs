//! Applying masking rules to the staging copy: the rules are resolved against its catalog
//! and checked against its foreign keys, then sampling and masking run in one transaction.

use std::collections::BTreeMap;

use serde::Serialize;
use tokio_postgres::Client;

use super::{MaskError, MaskRules, Rule, TableName};

/// One column of the staging copy.
#[derive(Debug, Clone)]
struct Column {
    schema: String,
    table: String,
    name: String,
    /// `format_type` of the column.
    sql_type: String,
    not_null: bool,
}

/// A foreign key of the staging copy.
#[derive(Debug, Clone)]
struct ForeignKey {
    name: String,
    child: (String, String),
    cols: Vec<String>,
    parent: (String, String),
    ref_cols: Vec<String>,
}

/// What masking and sampling did, for the build's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MaskReport {
    /// `schema.table.column: rule`.
    pub masked: Vec<String>,
    /// Sampled tables.
    pub sampled: Vec<SampleReport>,
    /// Rows removed from tables because the rows they referenced were not sampled.
    pub trimmed: BTreeMap<String, u64>,
    /// Foreign keys checked after masking (all found consistent).
    pub foreign_keys_checked: usize,
    /// Every distinct value masking produced (fakes, so safe to keep) of at least
    /// [`MASKED_VALUE_MIN`] characters: promotion refuses a change that writes one back.
    pub masked_values: Vec<String>,
}

/// Shorter produced values are not kept (they would match unrelated text).
pub const MASKED_VALUE_MIN: usize = 6;

/// One sampled table.
#[derive(Debug, Clone, Serialize)]
pub struct SampleReport {
    /// `schema.table`.
    pub table: String,
    /// Percent asked for.
    pub percent: f64,
    /// Rows before.
    pub before: u64,
    /// Rows kept.
    pub after: u64,
}

fn qi(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn ql(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn qt(schema: &str, table: &str) -> String {
    format!("{}.{}", qi(schema), qi(table))
}

fn apply_err(what: &str, e: tokio_postgres::Error) -> MaskError {
    let msg = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    };
    MaskError::Apply(format!("{what}: {msg}"))
}

async fn columns(c: &Client) -> Result<Vec<Column>, MaskError> {
    let rows = c
        .query(
            "SELECT n.nspname::text, cl.relname::text, a.attname::text, \
                    format_type(a.atttypid, a.atttypmod), a.attnotnull \
             FROM pg_attribute a JOIN pg_class cl ON cl.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = cl.relnamespace \
             WHERE cl.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped \
               AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
               AND n.nspname NOT LIKE 'pg\\_toast%' \
             ORDER BY 1, 2, a.attnum",
            &[],
        )
        .await
        .map_err(|e| apply_err("reading the catalog", e))?;
    Ok(rows
        .iter()
        .map(|r| Column {
            schema: r.get(0),
            table: r.get(1),
            name: r.get(2),
            sql_type: r.get(3),
            not_null: r.get(4),
        })
        .collect())
}

async fn foreign_keys(c: &Client) -> Result<Vec<ForeignKey>, MaskError> {
    let rows = c
        .query(
            "SELECT con.conname::text, cn.nspname::text, cc.relname::text, \
               array(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY k(n, i) \
                     JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n ORDER BY k.i), \
               pn.nspname::text, pc.relname::text, \
               array(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY k(n, i) \
                     JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n ORDER BY k.i) \
             FROM pg_constraint con \
             JOIN pg_class cc ON cc.oid = con.conrelid JOIN pg_namespace cn ON cn.oid = cc.relnamespace \
             JOIN pg_class pc ON pc.oid = con.confrelid JOIN pg_namespace pn ON pn.oid = pc.relnamespace \
             WHERE con.contype = 'f' ORDER BY 2, 3, 1",
            &[],
        )
        .await
        .map_err(|e| apply_err("reading foreign keys", e))?;
    Ok(rows
        .iter()
        .map(|r| ForeignKey {
            name: r.get(0),
            child: (r.get(1), r.get(2)),
            cols: r.get(3),
            parent: (r.get(4), r.get(5)),
            ref_cols: r.get(6),
        })
        .collect())
}

/// Finds the one table a rules-file name means.
fn resolve_table(
    cols: &[Column],
    name: &TableName,
    key: &str,
) -> Result<(String, String), MaskError> {
    let mut found: Vec<(String, String)> = cols
        .iter()
        .filter(|c| c.table == name.table && name.schema.as_ref().is_none_or(|s| *s == c.schema))
        .map(|c| (c.schema.clone(), c.table.clone()))
        .collect();
    found.dedup();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(MaskError::Invalid(format!(
            "{key:?}: no table {} in the copied schemas",
            match &name.schema {
                Some(s) => format!("{s}.{}", name.table),
                None => name.table.clone(),
            }
        ))),
        _ => Err(MaskError::Invalid(format!(
            "{key:?}: table {} is in several schemas ({}); write schema.table",
            name.table,
            found
                .iter()
                .map(|f| f.0.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// A resolved column rule.
struct Resolved {
    col: Column,
    rule: Rule,
}

fn is_text(t: &str) -> bool {
    t == "text"
        || t.starts_with("character varying")
        || t.starts_with("character(")
        || t == "character"
}

/// The expression a rule puts in the column; `v` is the quoted column, `salt` a literal.
fn expression(r: &Resolved, salt: &str) -> Result<String, MaskError> {
    let v = qi(&r.col.name);
    let t = r.col.sql_type.as_str();
    let md5 = |tag: &str| format!("md5({} || {v}::text)", ql(&format!("{salt}{tag}")));
    let text_only = |rule: &str| -> Result<(), MaskError> {
        if is_text(t) {
            Ok(())
        } else {
            Err(MaskError::Invalid(format!(
                "{}.{}.{}: rule {rule} needs a text column, not {t}",
                r.col.schema, r.col.table, r.col.name
            )))
        }
    };
    let e = match &r.rule {
        Rule::Email => {
            text_only("email")?;
            format!(
                "'user-' || substr({}, 1, 12) || '@example.invalid'",
                md5("email")
            )
        }
        Rule::Name => {
            text_only("name")?;
            format!("'Person ' || upper(substr({}, 1, 8))", md5("name"))
        }
        Rule::Phone => {
            text_only("phone")?;
            format!(
                "'+1-555-' || lpad(((('x' || substr({}, 1, 7))::bit(28)::int) % 10000000)::text, 7, '0')",
                md5("phone")
            )
        }
        Rule::Hash => {
            let h = md5("hash");
            match t {
                "integer" => format!("('x' || substr({h}, 1, 8))::bit(32)::int"),
                "bigint" => format!("('x' || substr({h}, 1, 16))::bit(64)::bigint"),
                "smallint" => format!("((('x' || substr({h}, 1, 4))::bit(16)::int) - 32768)::smallint"),
                "uuid" => format!("{h}::uuid"),
                t if is_text(t) => format!("'h' || substr({h}, 1, 15)"),
                other => {
                    return Err(MaskError::Invalid(format!(
                        "{}.{}.{}: rule hash supports integer, bigint, smallint, uuid and text columns, not {other}",
                        r.col.schema, r.col.table, r.col.name
                    )))
                }
            }
        }
        Rule::Null => {
            if r.col.not_null {
                return Err(MaskError::Invalid(format!(
                    "{}.{}.{}: rule null on a NOT NULL column",
                    r.col.schema, r.col.table, r.col.name
                )));
            }
            "NULL".into()
        }
        Rule::Constant(c) => format!("{}::{t}", ql(c)),
        Rule::Sql(e) => format!("({e})"),
    };
    Ok(format!("({e})::{t}"))
}

fn resolve_columns(rules: &MaskRules, cols: &[Column]) -> Result<Vec<Resolved>, MaskError> {
    let mut out: Vec<Resolved> = Vec::new();
    for (name, column, rule, key) in &rules.columns {
        let (schema, table) = resolve_table(cols, name, key)?;
        let col = cols
            .iter()
            .find(|c| c.schema == schema && c.table == table && c.name == *column)
            .ok_or_else(|| {
                MaskError::Invalid(format!(
                    "{key:?}: table {schema}.{table} has no column {column:?}"
                ))
            })?;
        if out
            .iter()
            .any(|r| r.col.schema == schema && r.col.table == table && r.col.name == *column)
        {
            return Err(MaskError::Invalid(format!(
                "{key:?}: column {schema}.{table}.{column} has two rules"
            )));
        }
        out.push(Resolved {
            col: col.clone(),
            rule: rule.clone(),
        });
    }
    Ok(out)
}

/// Refuses rules that would break a foreign key: a referenced column that is rewritten must be
/// rewritten the same join-keeping way on the referencing side, and vice versa (a referencing
/// column may only be set to NULL on its own).
fn check_joins(resolved: &[Resolved], fks: &[ForeignKey]) -> Result<(), MaskError> {
    let rule_of = |s: &str, t: &str, c: &str| {
        resolved
            .iter()
            .find(|r| r.col.schema == s && r.col.table == t && r.col.name == c)
            .map(|r| &r.rule)
    };
    for fk in fks {
        for (c, p) in fk.cols.iter().zip(&fk.ref_cols) {
            let child = rule_of(&fk.child.0, &fk.child.1, c);
            let parent = rule_of(&fk.parent.0, &fk.parent.1, p);
            let ok = match (child, parent) {
                (None, None) | (Some(Rule::Null), None) => true,
                (Some(a), Some(b)) => a == b && a.keeps_joins(),
                _ => false,
            };
            if !ok {
                let show =
                    |r: Option<&Rule>| r.map(Rule::label).unwrap_or_else(|| "no rule".into());
                return Err(MaskError::Invalid(format!(
                    "{}.{}.{c} references {}.{}.{p} (foreign key {}): give both the same rule \
                     hash (or email/name/phone) so masked keys still join; found {} and {}",
                    fk.child.0,
                    fk.child.1,
                    fk.parent.0,
                    fk.parent.1,
                    fk.name,
                    show(child),
                    show(parent)
                )));
            }
        }
    }
    Ok(())
}

fn orphan_condition(fk: &ForeignKey) -> String {
    let not_null: Vec<String> = fk
        .cols
        .iter()
        .map(|c| format!("c.{} IS NOT NULL", qi(c)))
        .collect();
    let join: Vec<String> = fk
        .cols
        .iter()
        .zip(&fk.ref_cols)
        .map(|(c, p)| format!("p.{} = c.{}", qi(p), qi(c)))
        .collect();
    format!(
        "{} AND NOT EXISTS (SELECT 1 FROM {} p WHERE {})",
        not_null.join(" AND "),
        qt(&fk.parent.0, &fk.parent.1),
        join.join(" AND ")
    )
}

/// Checks the rules against the staging copy, then samples and masks it in one transaction
/// with triggers (and so foreign-key checks) off, and checks every foreign key afterwards.
/// A hash collision on a unique key is retried with a new salt.
pub async fn apply(c: &mut Client, rules: &MaskRules) -> Result<MaskReport, MaskError> {
    let cols = columns(c).await?;
    let fks = foreign_keys(c).await?;
    let resolved = resolve_columns(rules, &cols)?;
    check_joins(&resolved, &fks)?;
    let mut samples = Vec::new();
    for (name, pct, key) in &rules.samples {
        let t = resolve_table(&cols, name, key)?;
        if samples.iter().any(|(s, _)| *s == t) {
            return Err(MaskError::Invalid(format!("{key:?}: table sampled twice")));
        }
        samples.push((t, *pct));
    }
    // Expressions are checked for column types once before anything runs.
    expressions(&resolved, "check")?;
    let mut last = None;
    for _attempt in 0..3 {
        let salt = hex::encode(rand::random::<[u8; 16]>());
        match apply_once(c, &resolved, &samples, &fks, &salt).await {
            Ok(r) => return Ok(r),
            Err((true, e)) => last = Some(e),
            Err((false, e)) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| MaskError::Apply("masking failed".into())))
}

/// `schema.table` → `col = expr` list.
fn expressions(
    resolved: &[Resolved],
    salt: &str,
) -> Result<BTreeMap<(String, String), Vec<String>>, MaskError> {
    let mut by_table: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for r in resolved {
        let e = expression(r, salt)?;
        by_table
            .entry((r.col.schema.clone(), r.col.table.clone()))
            .or_default()
            .push(format!("{} = {e}", qi(&r.col.name)));
    }
    Ok(by_table)
}

/// One try; the error's flag says whether another salt may succeed (unique violation).
async fn apply_once(
    c: &mut Client,
    resolved: &[Resolved],
    samples: &[((String, String), f64)],
    fks: &[ForeignKey],
    salt: &str,
) -> Result<MaskReport, (bool, MaskError)> {
    let fatal = |e: MaskError| (false, e);
    let tx = c
        .transaction()
        .await
        .map_err(|e| fatal(apply_err("begin", e)))?;
    // Triggers off: keys change table by table, and sampled parents leave orphans that are
    // removed below rather than by (or blocked by) ON DELETE actions.
    tx.batch_execute("SET LOCAL session_replication_role = replica")
        .await
        .map_err(|e| fatal(apply_err("session_replication_role", e)))?;
    let mut report = MaskReport::default();
    for ((s, t), pct) in samples {
        let count = format!("SELECT count(*) FROM {}", qt(s, t));
        let before: i64 = tx
            .query_one(&count, &[])
            .await
            .map_err(|e| fatal(apply_err(&format!("counting {s}.{t}"), e)))?
            .get(0);
        tx.execute(
            &format!("DELETE FROM {} WHERE random() * 100 >= {pct}", qt(s, t)),
            &[],
        )
        .await
        .map_err(|e| fatal(apply_err(&format!("sampling {s}.{t}"), e)))?;
        let after: i64 = tx
            .query_one(&count, &[])
            .await
            .map_err(|e| fatal(apply_err(&format!("counting {s}.{t}"), e)))?
            .get(0);
        report.sampled.push(SampleReport {
            table: format!("{s}.{t}"),
            percent: *pct,
            before: before as u64,
            after: after as u64,
        });
    }
    if !samples.is_empty() {
        // Rows whose referenced row was not kept go too, until nothing changes (a cycle
        // of keys converges as well: every pass only deletes).
        loop {
            let mut deleted = 0;
            for fk in fks {
                let n = tx
                    .execute(
                        &format!(
                            "DELETE FROM {} c WHERE {}",
                            qt(&fk.child.0, &fk.child.1),
                            orphan_condition(fk)
                        ),
                        &[],
                    )
                    .await
                    .map_err(|e| {
                        fatal(apply_err(
                            &format!(
                                "removing rows of {}.{} left without their {}.{} row",
                                fk.child.0, fk.child.1, fk.parent.0, fk.parent.1
                            ),
                            e,
                        ))
                    })?;
                if n > 0 {
                    *report
                        .trimmed
                        .entry(format!("{}.{}", fk.child.0, fk.child.1))
                        .or_default() += n;
                    deleted += n;
                }
            }
            if deleted == 0 {
                break;
            }
        }
    }
    for ((s, t), sets) in expressions(resolved, salt).map_err(fatal)? {
        let sql = format!("UPDATE {} SET {}", qt(&s, &t), sets.join(", "));
        if let Err(e) = tx.execute(&sql, &[]).await {
            let retry = e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION);
            return Err((retry, apply_err(&format!("masking {s}.{t}"), e)));
        }
    }
    // What masking produced, read back: constants and NULLs carry nothing of the source.
    for r in resolved {
        if matches!(r.rule, Rule::Null | Rule::Constant(_)) {
            continue;
        }
        let q = format!(
            "SELECT DISTINCT {c}::text FROM {t} WHERE {c} IS NOT NULL AND length({c}::text) >= {MASKED_VALUE_MIN}",
            c = qi(&r.col.name),
            t = qt(&r.col.schema, &r.col.table)
        );
        let rows = tx
            .query(&q, &[])
            .await
            .map_err(|e| fatal(apply_err("reading masked values", e)))?;
        report
            .masked_values
            .extend(rows.iter().map(|row| row.get::<_, String>(0)));
    }
    report.masked_values.sort();
    report.masked_values.dedup();
    for r in resolved {
        report.masked.push(format!(
            "{}.{}.{}: {}",
            r.col.schema,
            r.col.table,
            r.col.name,
            r.rule.label()
        ));
    }
    for fk in fks {
        let n: i64 = tx
            .query_one(
                &format!(
                    "SELECT count(*) FROM {} c WHERE {}",
                    qt(&fk.child.0, &fk.child.1),
                    orphan_condition(fk)
                ),
                &[],
            )
            .await
            .map_err(|e| fatal(apply_err("checking foreign keys", e)))?
            .get(0);
        if n > 0 {
            return Err(fatal(MaskError::Apply(format!(
                "after masking, {n} rows of {}.{} no longer match {}.{} (foreign key {}); \
                 the rules cannot keep it consistent",
                fk.child.0, fk.child.1, fk.parent.0, fk.parent.1, fk.name
            ))));
        }
    }
    report.foreign_keys_checked = fks.len();
    tx.commit()
        .await
        .map_err(|e| fatal(apply_err("commit", e)))?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(t: &str, c: &str, ty: &str) -> Column {
        Column {
            schema: "public".into(),
            table: t.into(),
            name: c.into(),
            sql_type: ty.into(),
            not_null: c == "id",
        }
    }

    #[test]
    fn resolves_and_checks_joins() {
        let cols = vec![
            col("customers", "id", "integer"),
            col("orders", "customer_id", "integer"),
            col("orders", "total", "numeric(10,2)"),
        ];
        let fks = vec![ForeignKey {
            name: "orders_customer_id_fkey".into(),
            child: ("public".into(), "orders".into()),
            cols: vec!["customer_id".into()],
            parent: ("public".into(), "customers".into()),
            ref_cols: vec!["id".into()],
        }];
        let only_parent = MaskRules::parse("[columns]\n\"customers.id\" = \"hash\"").unwrap();
        let r = resolve_columns(&only_parent, &cols).unwrap();
        let e = check_joins(&r, &fks).unwrap_err().to_string();
        assert!(
            e.contains("orders.customer_id references public.customers.id"),
            "{e}"
        );
        let both = MaskRules::parse(
            "[columns]\n\"customers.id\" = \"hash\"\n\"orders.customer_id\" = \"hash\"",
        )
        .unwrap();
        let r = resolve_columns(&both, &cols).unwrap();
        check_joins(&r, &fks).unwrap();
        let unknown = MaskRules::parse("[columns]\n\"orders.nope\" = \"hash\"").unwrap();
        let e = resolve_columns(&unknown, &cols).err().unwrap().to_string();
        assert!(e.contains("has no column \"nope\""), "{e}");
        let no_table = MaskRules::parse("[columns]\n\"x.nope\" = \"hash\"").unwrap();
        let e = resolve_columns(&no_table, &cols).err().unwrap().to_string();
        assert!(e.contains("no table x"), "{e}");
        let wrong_type = MaskRules::parse("[columns]\n\"orders.total\" = \"hash\"").unwrap();
        let r = resolve_columns(&wrong_type, &cols).unwrap();
        assert!(expressions(&r, "s")
            .unwrap_err()
            .to_string()
            .contains("not numeric"));
        let null_pk = MaskRules::parse("[columns]\n\"customers.id\" = \"null\"").unwrap();
        let r = resolve_columns(&null_pk, &cols).unwrap();
        assert!(expressions(&r, "s")
            .unwrap_err()
            .to_string()
            .contains("NOT NULL"));
    }
}
