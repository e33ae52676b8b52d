//! A reader for the YAML subset docs/api.yaml is written in (block mappings and sequences,
//! flow `{}`/`[]`, quoted and plain scalars, `|` block text), into `serde_json::Value` with
//! every scalar a string. A line it does not understand is an error, so the drift test fails
//! rather than silently missing a route.

use serde_json::{Map, Value};

struct Line<'a> {
    no: usize,
    indent: usize,
    text: &'a str,
}

/// Parses the whole document.
pub fn parse(doc: &str) -> Result<Value, String> {
    let lines: Vec<Line> = doc
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| Line {
            no: i + 1,
            indent: l.len() - l.trim_start().len(),
            text: l.trim(),
        })
        .collect();
    let mut pos = 0;
    let v = block(&lines, &mut pos, 0, doc)?;
    if pos != lines.len() {
        return Err(format!("line {}: unexpected indentation", lines[pos].no));
    }
    Ok(v)
}

/// A block node whose lines are indented at least `min`.
fn block(lines: &[Line], pos: &mut usize, min: usize, doc: &str) -> Result<Value, String> {
    let Some(first) = lines.get(*pos) else {
        return Ok(Value::Null);
    };
    if first.indent < min {
        return Ok(Value::Null);
    }
    let indent = first.indent;
    if first.text.starts_with("- ") || first.text == "-" {
        let mut items = Vec::new();
        while let Some(l) = lines.get(*pos) {
            if l.indent != indent || !(l.text.starts_with("- ") || l.text == "-") {
                break;
            }
            let rest = l.text[1..].trim_start();
            if rest.is_empty() {
                *pos += 1;
                items.push(block(lines, pos, indent + 1, doc)?);
            } else if rest.starts_with('{') || rest.starts_with('[') || split_key(rest).is_none() {
                *pos += 1;
                items.push(scalar_or_flow(rest, l.no)?);
            } else {
                // `- key: value` opens a mapping whose other keys sit under `key`.
                let inner = indent + (l.text.len() - rest.len());
                let mut map = Map::new();
                entry(lines, pos, inner, rest, l.no, &mut map, doc)?;
                mapping_into(lines, pos, inner, &mut map, doc)?;
                items.push(Value::Object(map));
            }
        }
        return Ok(Value::Array(items));
    }
    let mut map = Map::new();
    mapping_into(lines, pos, indent, &mut map, doc)?;
    Ok(Value::Object(map))
}

fn mapping_into(
    lines: &[Line],
    pos: &mut usize,
    indent: usize,
    map: &mut Map<String, Value>,
    doc: &str,
) -> Result<(), String> {
    while let Some(l) = lines.get(*pos) {
        if l.indent < indent {
            break;
        }
        if l.indent > indent {
            return Err(format!("line {}: unexpected indentation", l.no));
        }
        if l.text.starts_with("- ") {
            break;
        }
        entry(lines, pos, indent, l.text, l.no, map, doc)?;
    }
    Ok(())
}

/// One `key: value` at `lines[*pos]` (whose text is `text`), with its nested block if any.
fn entry(
    lines: &[Line],
    pos: &mut usize,
    indent: usize,
    text: &str,
    no: usize,
    map: &mut Map<String, Value>,
    doc: &str,
) -> Result<(), String> {
    let (key, rest) = split_key(text).ok_or_else(|| format!("line {no}: no `key:` in {text:?}"))?;
    *pos += 1;
    let value = if rest == "|" || rest == ">" {
        let mut out = Vec::new();
        while let Some(l) = lines.get(*pos) {
            if l.indent <= indent {
                break;
            }
            out.push(doc.lines().nth(l.no - 1).unwrap_or("").trim_start());
            *pos += 1;
        }
        Value::String(out.join("\n"))
    } else if rest.is_empty() {
        match lines.get(*pos) {
            Some(n) if n.indent > indent || (n.indent == indent && n.text.starts_with("- ")) => {
                block(lines, pos, n.indent, doc)?
            }
            _ => Value::Null,
        }
    } else {
        scalar_or_flow(rest, no)?
    };
    map.insert(key, value);
    Ok(())
}

/// `key: rest` split at the first `: ` (or a trailing `:`) outside quotes.
fn split_key(text: &str) -> Option<(String, &str)> {
    if let Some(q) = text.chars().next().filter(|c| *c == '\'' || *c == '"') {
        let end = text[1..].find(q)? + 1;
        let after = text[end + 1..].strip_prefix(':')?;
        return Some((text[1..end].to_string(), after.trim()));
    }
    let i = text
        .find(": ")
        .or_else(|| text.strip_suffix(':').map(|t| t.len()))?;
    Some((text[..i].to_string(), text[i + 1..].trim()))
}

fn scalar_or_flow(text: &str, no: usize) -> Result<Value, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let v = flow(&chars, &mut i, false).map_err(|e| format!("line {no}: {e} in {text:?}"))?;
    skip_ws(&chars, &mut i);
    if i != chars.len() {
        return Err(format!("line {no}: trailing text in {text:?}"));
    }
    Ok(v)
}

fn skip_ws(c: &[char], i: &mut usize) {
    while *i < c.len() && c[*i] == ' ' {
        *i += 1;
    }
}

/// A flow node; `nested` = inside `{}`/`[]`, where `,` `}` `]` end a plain scalar.
fn flow(c: &[char], i: &mut usize, nested: bool) -> Result<Value, String> {
    skip_ws(c, i);
    match c.get(*i) {
        Some('{') => {
            *i += 1;
            let mut map = Map::new();
            loop {
                skip_ws(c, i);
                if c.get(*i) == Some(&'}') {
                    *i += 1;
                    return Ok(Value::Object(map));
                }
                let key = match flow(c, i, true)? {
                    Value::String(s) => s,
                    other => return Err(format!("flow key {other}")),
                };
                skip_ws(c, i);
                let value = if c.get(*i) == Some(&':') {
                    *i += 1;
                    flow(c, i, true)?
                } else {
                    Value::Null
                };
                map.insert(key, value);
                skip_ws(c, i);
                match c.get(*i) {
                    Some(',') => *i += 1,
                    Some('}') => {}
                    _ => return Err("unclosed {".into()),
                }
            }
        }
        Some('[') => {
            *i += 1;
            let mut items = Vec::new();
            loop {
                skip_ws(c, i);
                if c.get(*i) == Some(&']') {
                    *i += 1;
                    return Ok(Value::Array(items));
                }
                items.push(flow(c, i, true)?);
                skip_ws(c, i);
                match c.get(*i) {
                    Some(',') => *i += 1,
                    Some(']') => {}
                    _ => return Err("unclosed [".into()),
                }
            }
        }
        Some(q @ ('\'' | '"')) => {
            let q = *q;
            *i += 1;
            let mut s = String::new();
            while let Some(&ch) = c.get(*i) {
                *i += 1;
                if ch == q {
                    // '' inside single quotes is one quote.
                    if q == '\'' && c.get(*i) == Some(&'\'') {
                        *i += 1;
                        s.push('\'');
                        continue;
                    }
                    return Ok(Value::String(s));
                }
                if ch == '\\' && q == '"' {
                    if let Some(&n) = c.get(*i) {
                        *i += 1;
                        s.push(n);
                    }
                    continue;
                }
                s.push(ch);
            }
            Err("unclosed quote".into())
        }
        _ => {
            let start = *i;
            while let Some(&ch) = c.get(*i) {
                if nested && (ch == ',' || ch == '}' || ch == ']') {
                    break;
                }
                // `key: value` inside a flow mapping: the key ends at `: `.
                if nested && ch == ':' && c.get(*i + 1).is_none_or(|n| *n == ' ') {
                    break;
                }
                *i += 1;
            }
            let s: String = c[start..*i].iter().collect();
            Ok(Value::String(s.trim().to_string()))
        }
    }
}
