//! What the CLI prints for a person: token lists and details, reap findings, golden
//! versions, statement log lines and promote results, from the API's JSON.

use serde_json::Value;

/// A token's review as a person reads it: `review failed: <reason>`, `review pending`,
/// `review stored`, or `-` while the token is usable.
pub fn review_words(v: &Value) -> String {
    match v.get("review").and_then(Value::as_str) {
        Some(r) => format!("review {}", one_line(r)),
        None => "-".into(),
    }
}

/// `s` on one line: control characters shown as `\u{..}` escapes.
pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `token list` without `--json`: a header and one line per token, each column as wide as
/// its widest cell (task names and ids have no fixed length), two spaces between columns.
pub fn token_table(tokens: &[Value]) -> String {
    const HEADER: [&str; 6] = ["ID", "STATE", "TASK", "EXPIRES", "SESSIONS", "REVIEW"];
    let rows: Vec<[String; 6]> = tokens
        .iter()
        .map(|v| {
            let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
            let sessions = v.get("sessions").and_then(Value::as_u64).unwrap_or(0);
            [
                s("id"),
                s("state"),
                s("task"),
                s("expires_at"),
                sessions.to_string(),
                review_words(v),
            ]
        })
        .collect();
    let mut width = HEADER.map(|h| h.chars().count());
    for r in &rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    std::iter::once(HEADER.map(str::to_string))
        .chain(rows)
        .map(|r| {
            let line: Vec<String> = r
                .iter()
                .zip(width)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            line.join("  ").trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `token show` without `--json`: one `key: value` line per field, in the API's order.
pub fn token_text(v: &Value) -> String {
    let Some(map) = v.as_object() else {
        return v.to_string();
    };
    let width = map.keys().map(String::len).max().unwrap_or(0);
    map.iter()
        .map(|(k, val)| {
            let shown = match val {
                // "review failed: <reason>", as everywhere else.
                Value::String(_) if k == "review" => review_words(v),
                Value::String(s) => s.clone(),
                Value::Null => "-".into(),
                Value::Object(o) if o.is_empty() => "-".into(),
                Value::Object(o) => o
                    .iter()
                    .map(|(mk, mv)| format!("{mk}={}", mv.as_str().unwrap_or(&mv.to_string())))
                    .collect::<Vec<_>>()
                    .join(", "),
                Value::Array(a) => a
                    .iter()
                    .map(|x| x.as_str().map(str::to_string).unwrap_or(x.to_string()))
                    .collect::<Vec<_>>()
                    .join(","),
                other => other.to_string(),
            };
            format!("{k:<width$}  {shown}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `sandpit reap` output: a summary line, then one line per finding.
pub fn reap_text(v: &Value) -> String {
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let list = |k: &str| {
        v.get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let dry = v.get("dry_run").and_then(Value::as_bool).unwrap_or(false);
    let (reaped, vanished) = (list("reaped"), list("vanished"));
    let mut out = vec![format!(
        "{}{} backends: {} kept, {} {}, {} vanished, {} skipped, {} errors",
        if dry { "dry run: " } else { "" },
        n("backends"),
        n("kept"),
        reaped.len(),
        if dry { "to reap" } else { "reaped" },
        vanished.len(),
        list("skipped").len(),
        list("errors").len()
    )];
    for r in &reaped {
        out.push(format!(
            "{} {}  token {}  task {}",
            if dry { "would reap" } else { "reaped" },
            s(r, "reason"),
            s(r, "token"),
            s(r, "task")
        ));
    }
    for t in &vanished {
        out.push(format!("vanished  token {}", t.as_str().unwrap_or("-")));
    }
    for k in list("skipped") {
        out.push(format!("skipped {}  {}", s(&k, "why"), s(&k, "handle")));
    }
    for e in list("errors") {
        out.push(format!("error  {}", e.as_str().unwrap_or("-")));
    }
    out.join("\n")
}

/// One line per golden version for `golden list`.
pub fn golden_line(v: &Value) -> String {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    format!(
        "{}{:<24} {:<4} forks {:<3} {}  {}",
        if v.get("active").and_then(Value::as_bool) == Some(true) {
            "* "
        } else {
            "  "
        },
        s("id"),
        s("kind"),
        v.get("forks").and_then(Value::as_u64).unwrap_or(0),
        s("created_at"),
        s("source")
    )
}

/// One line per logged statement for `sandpit log`.
pub fn statement_line(v: &Value) -> String {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let o = v.get("outcome").filter(|o| !o.is_null());
    let result = match o {
        None => "(no outcome)".to_string(),
        Some(o) if o.get("skipped").and_then(Value::as_bool) == Some(true) => "skipped".to_string(),
        Some(o) => {
            let rows = o
                .get("rows")
                .and_then(Value::as_u64)
                .map(|r| format!("{r} rows"))
                .unwrap_or_default();
            let capped = if o.get("capped").and_then(Value::as_bool) == Some(true) {
                " CAPPED"
            } else {
                ""
            };
            let err = o
                .get("sqlstate")
                .and_then(Value::as_str)
                .map(|c| format!(" ERROR {c}"))
                .unwrap_or_default();
            let ms = o.get("duration_ms").and_then(Value::as_f64).unwrap_or(0.0);
            format!("{rows}{capped}{err} {ms:.1}ms")
        }
    };
    let text: String = s("text").split_whitespace().collect::<Vec<_>>().join(" ");
    format!(
        "{} {} {:<11} {:<24} {}",
        s("ts"),
        s("session").replace('-', ""),
        s("kind"),
        result,
        text
    )
}

/// `sandpit promote` output for a person.
pub fn promote_text(v: &Value) -> String {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let n = |k: &str| v["counts"].get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut out = format!(
        "{} ({}): {} schema changes, {} inserted, {} updated, {} deleted rows, {} sequences",
        s("outcome"),
        s("target"),
        n("schema"),
        n("inserted"),
        n("updated"),
        n("deleted"),
        n("sequences")
    );
    for key in ["refusals", "conflicts"] {
        for c in v.get(key).and_then(Value::as_array).into_iter().flatten() {
            out.push_str(&format!(
                "\n  {}: {}",
                &key[..key.len() - 1],
                c.as_str().unwrap_or("")
            ));
        }
    }
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        out.push_str(&format!("\n  error: {e}"));
    }
    out
}
