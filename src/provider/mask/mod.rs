//! Masking rules for goldens built from a live database: which columns are rewritten and
//! how, which tables are sampled. Parsed strictly from TOML, resolved against the staging
//! copy's catalog, then applied there as the superuser before the golden is sealed.

use serde::Serialize;

mod apply;

pub use apply::{apply, MaskReport, SampleReport};

/// A problem with the masking rules or with applying them.
#[derive(Debug, thiserror::Error)]
pub enum MaskError {
    /// The rules file does not parse or names something unknown.
    #[error("masking rules: {0}")]
    Invalid(String),
    /// Applying the rules failed in the staging copy.
    #[error("masking: {0}")]
    Apply(String),
}

/// What a masked column becomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Rule {
    /// A made-up address, the same for the same original value.
    Email,
    /// A made-up name, the same for the same original value.
    Name,
    /// A made-up phone number, the same for the same original value.
    Phone,
    /// A keyed hash of the value in the column's own type; the same original gives the same
    /// hash in every table of one build, so masked keys still join.
    Hash,
    /// NULL.
    Null,
    /// A constant, cast to the column's type.
    Constant(String),
    /// A SQL expression over the row's original values.
    Sql(String),
}

impl Rule {
    fn parse(s: &str) -> Result<Rule, String> {
        let s = s.trim();
        if let Some(v) = s.strip_prefix("constant:") {
            return Ok(Rule::Constant(v.to_string()));
        }
        if let Some(e) = s.strip_prefix("sql:") {
            if e.trim().is_empty() {
                return Err("sql: needs an expression".into());
            }
            return Ok(Rule::Sql(e.to_string()));
        }
        match s {
            "email" => Ok(Rule::Email),
            "name" => Ok(Rule::Name),
            "phone" => Ok(Rule::Phone),
            "hash" => Ok(Rule::Hash),
            "null" => Ok(Rule::Null),
            other => Err(format!(
                "unknown rule {other:?} (use email, name, phone, hash, null, constant:VALUE or sql:EXPRESSION)"
            )),
        }
    }

    /// Short name, for reports.
    pub fn label(&self) -> String {
        match self {
            Rule::Email => "email".into(),
            Rule::Name => "name".into(),
            Rule::Phone => "phone".into(),
            Rule::Hash => "hash".into(),
            Rule::Null => "null".into(),
            Rule::Constant(_) => "constant".into(),
            Rule::Sql(_) => "sql".into(),
        }
    }

    /// Rules that give equal outputs for equal inputs across tables (so may sit on both
    /// ends of a foreign key).
    fn keeps_joins(&self) -> bool {
        matches!(self, Rule::Hash | Rule::Email | Rule::Name | Rule::Phone)
    }
}

/// `[schema.]table` as written in the rules file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    /// Schema, when given.
    pub schema: Option<String>,
    /// Table.
    pub table: String,
}

/// Parsed, not yet resolved, rules.
#[derive(Debug, Clone, Default)]
pub struct MaskRules {
    /// `(table, column, rule, key as written)`.
    pub columns: Vec<(TableName, String, Rule, String)>,
    /// `(table, percent kept, key as written)`.
    pub samples: Vec<(TableName, f64, String)>,
}

fn ident_ok(s: &str) -> bool {
    !s.is_empty() && !s.contains('\0') && s.len() <= 63
}

impl MaskRules {
    /// Parses the TOML rules file: `[columns]` `"[schema.]table.column" = "RULE"` and
    /// `[tables]` `"[schema.]table" = "sample:PERCENT"`. Anything else is an error.
    pub fn parse(text: &str) -> Result<MaskRules, MaskError> {
        let bad = |m: String| MaskError::Invalid(m);
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| bad(format!("not valid TOML: {}", e.message())))?;
        let mut rules = MaskRules::default();
        for (k, v) in &doc {
            let toml::Value::Table(entries) = v else {
                return Err(bad(format!(
                    "{k:?} must be a table ([columns] or [tables])"
                )));
            };
            for (key, val) in entries {
                let toml::Value::String(val) = val else {
                    return Err(bad(format!("[{k}] {key:?}: the rule must be a string")));
                };
                let parts: Vec<&str> = key.split('.').collect();
                match k.as_str() {
                    "columns" => {
                        let (schema, table, column) = match parts.as_slice() {
                            [t, c] => (None, *t, *c),
                            [s, t, c] => (Some(s.to_string()), *t, *c),
                            _ => {
                                return Err(bad(format!(
                                "[columns] {key:?}: write \"table.column\" or \"schema.table.column\""
                            )))
                            }
                        };
                        if !parts.iter().all(|p| ident_ok(p)) {
                            return Err(bad(format!("[columns] {key:?}: empty or too long name")));
                        }
                        let rule =
                            Rule::parse(val).map_err(|m| bad(format!("[columns] {key:?}: {m}")))?;
                        let name = TableName {
                            schema,
                            table: table.to_string(),
                        };
                        rules
                            .columns
                            .push((name, column.to_string(), rule, key.clone()));
                    }
                    "tables" => {
                        let name = match parts.as_slice() {
                            [t] => TableName {
                                schema: None,
                                table: t.to_string(),
                            },
                            [s, t] => TableName {
                                schema: Some(s.to_string()),
                                table: t.to_string(),
                            },
                            _ => {
                                return Err(bad(format!(
                                    "[tables] {key:?}: write \"table\" or \"schema.table\""
                                )))
                            }
                        };
                        if !parts.iter().all(|p| ident_ok(p)) {
                            return Err(bad(format!("[tables] {key:?}: empty or too long name")));
                        }
                        let pct = val
                            .trim()
                            .strip_prefix("sample:")
                            .ok_or_else(|| {
                                bad(format!(
                                    "[tables] {key:?}: unknown rule {val:?} (use sample:PERCENT)"
                                ))
                            })?
                            .trim()
                            .trim_end_matches('%')
                            .parse::<f64>()
                            .ok()
                            .filter(|p| p.is_finite() && *p > 0.0 && *p <= 100.0)
                            .ok_or_else(|| {
                                bad(format!(
                                    "[tables] {key:?}: percent in {val:?} must be a number above 0 and at most 100"
                                ))
                            })?;
                        rules.samples.push((name, pct, key.clone()));
                    }
                    other => {
                        return Err(bad(format!(
                            "unknown section [{other}] (use [columns] and [tables])"
                        )))
                    }
                }
            }
        }
        Ok(rules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let r = MaskRules::parse(
            r#"
[columns]
"public.customers.email" = "email"
"customers.id" = "hash"
"customers.notes" = "null"
"customers.tier" = "constant:basic"
"orders.total" = "sql:round(total * 0.9, 2)"
[tables]
"orders" = "sample:10"
"#,
        )
        .unwrap();
        assert_eq!(r.columns.len(), 5);
        let rule = |k: &str| r.columns.iter().find(|c| c.3 == k).expect(k).clone();
        let email = rule("public.customers.email");
        assert_eq!(email.0.schema.as_deref(), Some("public"));
        assert_eq!(
            (email.0.table.as_str(), email.1.as_str()),
            ("customers", "email")
        );
        assert_eq!(email.2, Rule::Email);
        assert_eq!(rule("customers.id").0.schema, None);
        assert_eq!(rule("customers.tier").2, Rule::Constant("basic".into()));
        assert_eq!(
            rule("orders.total").2,
            Rule::Sql("round(total * 0.9, 2)".into())
        );
        assert_eq!(r.samples[0].1, 10.0);
    }

    #[test]
    fn rejects_what_it_does_not_know() {
        for (text, needle) in [
            ("[columns]\n\"a.b\" = \"scramble\"", "unknown rule"),
            ("[columns]\n\"a\" = \"hash\"", "table.column"),
            ("[tables]\n\"t\" = \"sample:0\"", "above 0"),
            ("[tables]\n\"t\" = \"sample:101\"", "at most 100"),
            ("[tables]\n\"t\" = \"sample:x\"", "percent"),
            ("[tables]\n\"t\" = \"keep\"", "sample:PERCENT"),
            ("[rows]\n\"t\" = \"x\"", "unknown section"),
            ("[columns]\n\"a.b\" = 3", "must be a string"),
            ("columns = 1", "must be a table"),
            ("[columns", "not valid TOML"),
            ("[columns]\n\"a.b\" = \"sql:  \"", "needs an expression"),
        ] {
            let e = MaskRules::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
