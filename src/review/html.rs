//! The review as one self-contained HTML page (no scripts, no external resources): the
//! statements, the schema changes and the row changes side by side, the patch below.

use std::fmt::Write;

use super::escape::{cap, escape_of, is_hidden};
use super::model::{Review, TableDiff};
use super::render::{headline, verification};
use crate::journal::log::LoggedStatement;

/// Statements listed on the page (the log itself has all of them).
const STATEMENTS_MAX: usize = 1000;
/// Longest statement text shown.
const TEXT_MAX: usize = 2000;

/// Escape text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

fn show_inner(s: &str, keep_lines: bool) -> String {
    let mut o = String::with_capacity(s.len() + 24);
    o.push_str("<bdi dir=\"auto\">");
    for c in s.chars() {
        match c {
            '\n' | '\t' if keep_lines => o.push(c),
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if is_hidden(c) => {
                let _ = write!(o, "<span class=\"cc\">{}</span>", escape_of(c));
            }
            c => o.push(c),
        }
    }
    o.push_str("</bdi>");
    o
}

/// Text of the agent's (a value, a name, a message quoting them) for element content:
/// escaped, inside a bidi isolate (a right-to-left override cannot reach past it), every
/// control and format character shown as a styled `\u{..}`.
pub fn show(s: &str) -> String {
    show_inner(s, false)
}

/// [`show`] for `<pre>` text (statements, the patch): newlines and tabs lay it out.
pub fn show_lines(s: &str) -> String {
    show_inner(s, true)
}

/// A sample value: NULL, or the text output quoted and shown with [`show`].
pub fn show_value(v: &Option<String>) -> String {
    match v {
        None => "NULL".into(),
        Some(s) => format!("&#39;{}&#39;", show(&cap(s, VALUE_MAX).replace('\'', "''"))),
    }
}

/// Longest value shown in a sample cell.
const VALUE_MAX: usize = 80;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.3em}h2{font-size:1.1em;border-bottom:1px solid #ccc}\
.cols{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:1.5em;align-items:start}\
table{border-collapse:collapse;font-size:12px;margin:.3em 0 1em}td,th{border:1px solid #ddd;padding:2px 5px;vertical-align:top}\
pre,code{font:12px ui-monospace,monospace;white-space:pre-wrap;word-break:break-word}\
.ins{background:#e6ffec}.del{background:#ffebe9}.upd{background:#fff8c5}.chg{background:#ffd33d;font-weight:bold}\
.failed{background:#ffebe9}.muted{color:#777}\
bdi{unicode-bidi:isolate}.cc{color:#a00;background:#fee;border:1px dotted #a00;font:11px ui-monospace,monospace}";

fn statements(out: &mut String, r: &Review, stmts: &[LoggedStatement]) {
    let s = &r.statements;
    let kinds: Vec<String> = s
        .by_kind
        .iter()
        .map(|(k, n)| format!("{} {n}", esc(k)))
        .collect();
    let _ = write!(
        out,
        "<section id=\"statements\"><h2>Statements</h2><p>{} total ({}); {} failed; {} unfinished</p>",
        s.total,
        kinds.join(", "),
        s.failed.len(),
        s.unfinished
    );
    statement_table(out, stmts.iter().take(STATEMENTS_MAX));
    if stmts.len() > STATEMENTS_MAX {
        let _ = write!(
            out,
            "<p class=\"muted\">first {STATEMENTS_MAX} of {} shown</p>",
            stmts.len()
        );
    }
    out.push_str("</section>");
}

/// Statements of the log as a table: number, kind, text (agent text shown escaped), result.
pub fn statement_table<'a>(out: &mut String, stmts: impl Iterator<Item = &'a LoggedStatement>) {
    out.push_str("<table><tr><th>#</th><th>kind</th><th>statement</th><th>result</th></tr>");
    for st in stmts {
        let (class, result) = match &st.outcome {
            None => ("failed", "unfinished".to_string()),
            Some(o) => match &o.sqlstate {
                Some(code) => ("failed", format!("error {code}")),
                None => (
                    "",
                    format!(
                        "{}{}",
                        o.tag.clone().unwrap_or_default(),
                        if o.capped { " (capped)" } else { "" }
                    ),
                ),
            },
        };
        let _ = write!(
            out,
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
            st.statement.seq,
            esc(&st.statement.kind),
            show_lines(&cap(&st.statement.text, TEXT_MAX)),
            esc(&result)
        );
    }
    out.push_str("</table>");
}

/// The schema changes and moved sequences of `r` as a section.
pub fn schema(out: &mut String, r: &Review) {
    out.push_str("<section id=\"schema\"><h2>Schema changes</h2>");
    if r.schema.is_empty() && r.sequences.is_empty() {
        out.push_str("<p class=\"muted\">none</p>");
    }
    if !r.schema.is_empty() {
        out.push_str("<table><tr><th>change</th><th>object</th><th>detail</th></tr>");
        for c in &r.schema {
            let class = match c.action.word() {
                "added" => "ins",
                "dropped" => "del",
                _ => "upd",
            };
            let _ = write!(
                out,
                "<tr class=\"{class}\"><td>{} {}</td><td><code>{}</code></td><td><pre>{}</pre></td></tr>",
                c.action.word(),
                show(&c.kind),
                show(&c.object),
                show_lines(&c.detail)
            );
        }
        out.push_str("</table>");
    }
    if !r.sequences.is_empty() {
        out.push_str("<table><tr><th>sequence</th><th>before</th><th>after</th></tr>");
        for q in &r.sequences {
            let _ = write!(
                out,
                "<tr class=\"upd\"><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                show(&q.sequence),
                show(
                    &q.before
                        .as_ref()
                        .map(|b| b.last_value.clone())
                        .unwrap_or_else(|| "new".into())
                ),
                show(&q.after.last_value)
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section>");
}

fn cells(out: &mut String, vals: &[Option<String>], changed: &dyn Fn(usize) -> bool) {
    for (i, v) in vals.iter().enumerate() {
        let class = if changed(i) { " class=\"chg\"" } else { "" };
        let _ = write!(out, "<td{class}>{}</td>", show_value(v));
    }
}

/// One table's row changes: counts, then its sample rows (changed cells marked `chg`).
pub fn table(out: &mut String, t: &TableDiff) {
    let _ = write!(
        out,
        "<h3><code>{}</code></h3><p>{} inserted, {} updated, {} deleted; matched by {}</p>",
        show(&t.table),
        t.inserted,
        t.updated,
        t.deleted,
        show(&t.matched_by)
    );
    if let Some(e) = &t.error {
        let _ = write!(
            out,
            "<p class=\"failed\">could not be compared: {}</p>",
            show(e)
        );
    }
    if let Some(n) = &t.note {
        let _ = write!(out, "<p class=\"muted\">{}</p>", show(n));
    }
    if !t.updated_columns.is_empty() {
        let per: Vec<String> = t
            .updated_columns
            .iter()
            .map(|(c, n)| format!("{} {n}", show(c)))
            .collect();
        let _ = write!(out, "<p>updated per column: {}</p>", per.join(", "));
    }
    for (kind, s) in &t.samples.showing {
        let _ = write!(
            out,
            "<p class=\"muted showing\">{}: {} (counts are exact)</p>",
            esc(kind),
            esc(s)
        );
    }
    if t.samples.inserted.is_empty() && t.samples.deleted.is_empty() && t.samples.updated.is_empty()
    {
        return;
    }
    out.push_str("<table><tr><th></th>");
    for c in &t.columns {
        let _ = write!(out, "<th>{}</th>", show(c));
    }
    out.push_str("</tr>");
    for r in &t.samples.inserted {
        out.push_str("<tr class=\"ins\"><td>+</td>");
        cells(out, r, &|_| false);
        out.push_str("</tr>");
    }
    for r in &t.samples.deleted {
        out.push_str("<tr class=\"del\"><td>−</td>");
        cells(out, r, &|_| false);
        out.push_str("</tr>");
    }
    for u in &t.samples.updated {
        let changed = |i: usize| {
            t.columns
                .get(i)
                .map(|c| u.changed.contains(c))
                .unwrap_or(false)
        };
        out.push_str("<tr class=\"upd\"><td>before</td>");
        cells(out, &u.before, &changed);
        out.push_str("</tr><tr class=\"upd\"><td>after</td>");
        cells(out, &u.after, &changed);
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// The page.
pub fn page(r: &Review, stmts: &[LoggedStatement]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\
         <title>sandpit review {}</title><style>{STYLE}</style></head><body>\
         <h1>Review of token <code>{}</code> (task {})</h1><p id=\"headline\">{}</p>\
         <p class=\"muted\">taken {}; scanned {} of {} tables (mode {}); {:.0} ms</p><div class=\"cols\">",
        esc(&r.token),
        show(&r.token),
        show(&r.task),
        esc(&headline(r)),
        esc(&r.generated_at),
        r.scan.tables_scanned,
        r.scan.tables_total,
        esc(&r.scan.mode),
        r.duration_ms
    );
    statements(&mut out, r, stmts);
    schema(&mut out, r);
    out.push_str("<section id=\"rows\"><h2>Row changes</h2>");
    if r.data.is_empty() {
        out.push_str("<p class=\"muted\">none</p>");
    }
    for t in &r.data {
        table(&mut out, t);
    }
    out.push_str("</section></div>");
    if !r.notes.is_empty() {
        out.push_str("<h2>Notes</h2><ul>");
        for n in &r.notes {
            let _ = write!(out, "<li>{}</li>", show(n));
        }
        out.push_str("</ul>");
    }
    let _ = write!(
        out,
        "<h2>SQL patch</h2><p class=\"muted\">Never applied by sandpit.</p>\
         <pre id=\"verification\">{}</pre><pre id=\"patch\">{}</pre></body></html>",
        show_lines(&verification(r.verification.as_ref())),
        show_lines(&r.patch)
    );
    out.push('\n');
    out
}
