//! The review as plain text for a person.

use std::fmt::Write;

use super::escape::{cap, quoted, visible as v};
use super::model::{Review, TableDiff, Verification, VerifyStatus};

/// Longest value shown in a sample.
const VALUE_MAX: usize = 80;

/// A value as shown in samples: NULL, or the text output quoted on one line (hidden
/// characters escaped: a newline in a value cannot start a line of its own).
pub fn value(v: &Option<String>) -> String {
    match v {
        None => "NULL".into(),
        Some(s) => quoted(&cap(s, VALUE_MAX)),
    }
}

fn row(cols: &[String], vals: &[Option<String>]) -> String {
    cols.iter()
        .zip(vals)
        .map(|(c, x)| format!("{}={}", v(c), value(x)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line summing up a review.
pub fn headline(r: &Review) -> String {
    if r.is_empty() {
        "no changes against the golden".to_string()
    } else {
        let (i, u, d) = r.data.iter().fold((0, 0, 0), |a, t| {
            (a.0 + t.inserted, a.1 + t.updated, a.2 + t.deleted)
        });
        format!(
            "{} schema change(s), {} sequence(s) moved, {} table(s) with row changes ({i} inserted, {u} updated, {d} deleted)",
            r.schema.len(),
            r.sequences.len(),
            r.data.len()
        )
    }
}

fn table(out: &mut String, t: &TableDiff) {
    let by = if t.key.is_empty() {
        t.matched_by.clone()
    } else {
        format!("{} ({})", t.matched_by, v(&t.key.join(", ")))
    };
    let _ = writeln!(out, "  {} — matched by {by}", v(&t.table));
    if let Some(e) = &t.error {
        let _ = writeln!(out, "    could not be compared: {}", v(e));
    }
    if let Some(n) = &t.note {
        let _ = writeln!(out, "    note: {}", v(n));
    }
    let _ = writeln!(
        out,
        "    {} inserted, {} updated, {} deleted",
        t.inserted, t.updated, t.deleted
    );
    for r in &t.samples.inserted {
        let _ = writeln!(out, "    + {}", row(&t.columns, r));
    }
    for r in &t.samples.deleted {
        let _ = writeln!(out, "    - {}", row(&t.columns, r));
    }
    for u in &t.samples.updated {
        let key: Vec<String> = t
            .columns
            .iter()
            .zip(&u.before)
            .filter(|(c, _)| t.key.contains(c))
            .map(|(c, x)| format!("{}={}", v(c), value(x)))
            .collect();
        let changes: Vec<String> = t
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| u.changed.contains(c))
            .map(|(i, c)| {
                format!(
                    "{}: {} -> {}",
                    v(c),
                    value(&u.before.get(i).cloned().flatten()),
                    value(&u.after.get(i).cloned().flatten())
                )
            })
            .collect();
        let _ = writeln!(out, "    ~ {}: {}", key.join(", "), changes.join("; "));
    }
    if !t.updated_columns.is_empty() {
        let per: Vec<String> = t
            .updated_columns
            .iter()
            .map(|(c, n)| format!("{} {n}", v(c)))
            .collect();
        let _ = writeln!(out, "    updated per column: {}", per.join(", "));
    }
    for (kind, s) in &t.samples.showing {
        let _ = writeln!(out, "    {kind}: {} (counts are exact)", v(s));
    }
}

/// The whole review as text.
pub fn text(r: &Review) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Review of token {} (task {}) at {}",
        v(&r.token),
        v(&r.task),
        r.generated_at
    );
    let _ = writeln!(out, "{}", headline(r));
    out.push_str(&verification(r.verification.as_ref()));
    let _ = writeln!(
        out,
        "Scanned {} of {} tables (mode {}{}), {} rows read, {:.0} ms",
        r.scan.tables_scanned,
        r.scan.tables_total,
        r.scan.mode,
        r.scan
            .reason
            .as_ref()
            .map(|x| format!(": {x}"))
            .unwrap_or_default(),
        r.scan.rows_read,
        r.duration_ms
    );
    let s = &r.statements;
    let kinds: Vec<String> = s.by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(
        out,
        "\nStatements: {} ({}), {} failed, {} unfinished",
        s.total,
        if kinds.is_empty() {
            "none".into()
        } else {
            kinds.join(", ")
        },
        s.failed.len(),
        s.unfinished
    );
    for f in &s.failed {
        let _ = writeln!(
            out,
            "  #{} [{}] {} {}",
            f.seq,
            f.kind,
            v(&f.sqlstate),
            v(&f.text)
        );
    }
    if !r.schema.is_empty() {
        let _ = writeln!(out, "\nSchema changes:");
        for c in &r.schema {
            let detail = if c.detail.is_empty() {
                String::new()
            } else {
                // Definitions span lines; on one line here, and nothing in them hidden.
                format!(" — {}", v(&c.detail.replace('\n', " ")))
            };
            let _ = writeln!(
                out,
                "  {} {} {}{detail}",
                c.action.word(),
                v(&c.kind),
                v(&c.object)
            );
        }
    }
    if !r.sequences.is_empty() {
        let _ = writeln!(out, "\nSequences:");
        for q in &r.sequences {
            let before = q
                .before
                .as_ref()
                .map(|b| {
                    format!(
                        "{}{}",
                        b.last_value,
                        if b.is_called { "" } else { " (not called)" }
                    )
                })
                .unwrap_or_else(|| "new".into());
            let _ = writeln!(
                out,
                "  {}: {} -> {}",
                v(&q.sequence),
                v(&before),
                v(&q.after.last_value)
            );
        }
    }
    if !r.data.is_empty() {
        let _ = writeln!(out, "\nRow changes:");
        for t in &r.data {
            table(&mut out, t);
        }
    }
    if !r.notes.is_empty() {
        let _ = writeln!(out, "\nNotes:");
        for n in &r.notes {
            let _ = writeln!(out, "  - {}", v(n));
        }
    }
    out
}

/// The check as text lines for a person (the text and HTML formats show these).
pub fn verification(v: Option<&Verification>) -> String {
    let mut out = String::new();
    match v {
        None => {
            let _ = writeln!(out, "patch not verified: this review predates the check");
        }
        Some(v) => {
            let _ = writeln!(out, "{}", v.summary);
            if v.status != VerifyStatus::NotVerified && v.reason.is_none() {
                let _ = writeln!(
                    out,
                    "  compared {} schema objects, {} tables ({} unchanged since the golden, \
                     not read), {} sequences in {:.0} ms",
                    v.compared.objects,
                    v.compared.tables,
                    v.compared.tables_unchanged,
                    v.compared.sequences,
                    v.duration_ms
                );
            }
            for d in &v.differences {
                let _ = writeln!(out, "  - {d}");
            }
            if v.differences_total > v.differences.len() {
                let _ = writeln!(
                    out,
                    "  (showing {} of {} differences)",
                    v.differences.len(),
                    v.differences_total
                );
            }
        }
    }
    out
}
