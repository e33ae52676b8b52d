//! Masked data never leaves: every value a change writes (inserted rows, created tables'
//! rows, the new values of updated cells) and every definition it adds (a default holding
//! one would write it into future rows) is searched for every value the golden's masking
//! produced — kept with the golden when it was built — equal or as a part, ignoring ASCII
//! case (an Aho-Corasick automaton over the kept set). A match refuses the promotion with
//! the table, row and column named: however the agent derived it (copied from a masked
//! column, `CREATE TABLE … AS`, concatenated, upper-cased), a masked value is a fake that
//! stands for a real one and must not reach the real database.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use crate::review::model::{Review, TableDiff};

/// Matches listed per table (the count is given).
const LISTED_PER_TABLE: usize = 5;

/// The automaton over a golden's masked values.
pub struct MaskedValues {
    ac: Option<AhoCorasick>,
    values: Vec<String>,
}

impl MaskedValues {
    /// Built from the kept values (empty strings dropped).
    pub fn new(values: &[String]) -> MaskedValues {
        let values: Vec<String> = values.iter().filter(|v| !v.is_empty()).cloned().collect();
        let ac = if values.is_empty() {
            None
        } else {
            AhoCorasickBuilder::new()
                .ascii_case_insensitive(true)
                .match_kind(MatchKind::LeftmostFirst)
                .build(&values)
                .ok()
        };
        MaskedValues { ac, values }
    }

    /// Whether any value is kept.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The first masked value found in `text`.
    pub fn find(&self, text: &str) -> Option<&str> {
        let m = self.ac.as_ref()?.find(text)?;
        self.values.get(m.pattern().as_usize()).map(String::as_str)
    }
}

fn row_label(t: &TableDiff, row: &[Option<String>]) -> String {
    let key: Vec<(usize, &String)> = t
        .key
        .iter()
        .filter_map(|k| t.columns.iter().position(|c| c == k).map(|i| (i, k)))
        .collect();
    if key.is_empty() {
        let all: Vec<String> = row
            .iter()
            .map(|v| v.clone().unwrap_or_else(|| "NULL".into()))
            .collect();
        return format!("row ({})", crate::review::escape::cap(&all.join(", "), 120));
    }
    let cols: Vec<&str> = key.iter().map(|(_, k)| k.as_str()).collect();
    let vals: Vec<String> = key
        .iter()
        .map(|(i, _)| row[*i].clone().unwrap_or_else(|| "NULL".into()))
        .collect();
    format!("row ({})=({})", cols.join(", "), vals.join(", "))
}

/// Why `review` may not be promoted: each written cell holding a masked value.
pub fn scan(review: &Review, masked: &MaskedValues) -> Vec<String> {
    let mut out = Vec::new();
    if masked.is_empty() {
        return out;
    }
    // Definitions too: a default or constraint holding one writes it into future rows.
    for c in &review.schema {
        if let Some(m) = c.after.as_deref().and_then(|d| masked.find(d)) {
            out.push(format!(
                "{} {} {}: its definition holds {m:?}, a value the golden's masking produced",
                c.kind,
                c.object,
                c.action.word()
            ));
        }
    }
    for t in &review.data {
        let mut found: Vec<String> = Vec::new();
        let mut total = 0usize;
        let mut check = |row: &[Option<String>], cols: &mut dyn Iterator<Item = usize>, what| {
            for i in cols {
                let Some(Some(v)) = row.get(i) else { continue };
                if let Some(m) = masked.find(v) {
                    total += 1;
                    if found.len() < LISTED_PER_TABLE {
                        found.push(format!(
                            "{what} {}: column {} holds {m:?}",
                            row_label(t, row),
                            t.columns[i]
                        ));
                    }
                }
            }
        };
        for row in &t.samples.inserted {
            check(row, &mut (0..t.columns.len()), "inserted");
        }
        for u in &t.samples.updated {
            let mut changed = u
                .changed
                .iter()
                .filter_map(|c| t.columns.iter().position(|x| x == c));
            check(&u.after, &mut changed, "updated");
        }
        if total > 0 {
            let more = if total > found.len() {
                format!(" (and {} more)", total - found.len())
            } else {
                String::new()
            };
            out.push(format!(
                "table {}: writes values the golden's masking produced, which stand for real data \
                 and never reach the target: {}{more}",
                t.table,
                found.join("; ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::model::{Samples, UpdatedRow};

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn equal_part_and_case_changed_values_are_found_with_row_and_column() {
        let m = MaskedValues::new(&["user-0a1b2c3d4e5f@example.invalid".into()]);
        assert!(m.find("x user-0a1b2c3d4e5f@example.invalid").is_some());
        assert!(m.find("USER-0A1B2C3D4E5F@EXAMPLE.INVALID").is_some());
        assert!(m.find("user-0a1b2c3d4e5f@example.com").is_none());
        let review = Review {
            data: vec![TableDiff {
                table: "public.orders".into(),
                key: vec!["id".into()],
                columns: vec!["id".into(), "status".into()],
                samples: Samples {
                    updated: vec![UpdatedRow {
                        before: vec![s("7"), s("open")],
                        after: vec![s("7"), s("x-USER-0A1B2C3D4E5F@EXAMPLE.INVALID")],
                        changed: vec!["status".into()],
                    }],
                    inserted: vec![vec![s("8"), s("fine")]],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = scan(&review, &m);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("public.orders") && r[0].contains("row (id)=(7): column status"),
            "{r:?}"
        );
        assert!(scan(&review, &MaskedValues::new(&[])).is_empty());
        let mut with_default = review.clone();
        with_default
            .schema
            .push(crate::review::model::SchemaChange {
                kind: "column".into(),
                action: crate::review::model::Action::Added,
                object: "public.orders.contact".into(),
                detail: String::new(),
                before: None,
                after: Some(
                    "contact text DEFAULT 'user-0a1b2c3d4e5f@example.invalid'::text".into(),
                ),
                sql: Vec::new(),
            });
        let r = scan(&with_default, &m);
        assert!(
            r.len() == 2 && r[0].starts_with("column public.orders.contact added: its definition"),
            "{r:?}"
        );
    }
}
