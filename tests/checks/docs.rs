//! Docs that must not drift from the code: docs/api.yaml against the router,
//! docs/statement-log.md against the log records, docs/configuration.md's reference against
//! config/sandpit.toml and the config struct, docs/operations.md's metrics table against the
//! recorded metrics; and the README as a front page (short, every docs/*.md in its index,
//! every relative link and anchor resolving).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use sandpit::journal::log::{LogRecord, OutcomeRecord, StatementRecord};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The text of `.route(...)` calls, parentheses matched.
fn route_calls(src: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find(".route(") {
        let body = &rest[i + ".route(".len()..];
        let mut depth = 1;
        let mut end = body.len();
        for (j, c) in body.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push(&body[..end]);
        rest = &body[end..];
    }
    out
}

/// (path, method) pairs the router serves.
fn routes() -> BTreeSet<(String, String)> {
    // The control API's router, and the /mcp routes it merges.
    routes_in(&(read("src/control/mod.rs") + &read("src/mcp/http.rs")))
}

/// (path, method) pairs of the `.route(...)` calls in `src`.
fn routes_in(src: &str) -> BTreeSet<(String, String)> {
    let mut set = BTreeSet::new();
    for call in route_calls(src) {
        let path = call
            .split('"')
            .nth(1)
            .unwrap_or_else(|| panic!("route without a path: {call}"));
        let bytes = call.as_bytes();
        for m in ["get", "post", "put", "patch", "delete"] {
            let pat = format!("{m}(");
            let found = call.match_indices(&pat).any(|(i, _)| {
                i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')
            });
            if found {
                set.insert((path.to_string(), m.to_string()));
            }
        }
    }
    set
}

/// (path, method) pairs docs/api.yaml describes.
fn documented() -> BTreeSet<(String, String)> {
    documented_in("docs/api.yaml")
}

/// (path, method) pairs an OpenAPI file describes (paths at indent 2, methods at indent 4).
fn documented_in(rel: &str) -> BTreeSet<(String, String)> {
    let doc = read(rel);
    let mut set = BTreeSet::new();
    let mut in_paths = false;
    let mut path = None;
    for l in doc.lines() {
        if !l.starts_with(' ') && !l.is_empty() {
            in_paths = l == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = l.strip_prefix("  /").and_then(|p| p.strip_suffix(':')) {
            path = Some(format!("/{p}"));
        } else if let (Some(p), Some(m)) = (
            &path,
            l.strip_prefix("    ").and_then(|m| m.strip_suffix(':')),
        ) {
            if ["get", "post", "put", "patch", "delete"].contains(&m) {
                set.insert((p.clone(), m.to_string()));
            }
        }
    }
    set
}

#[test]
fn api_yaml_lists_every_route_and_no_other() {
    let routes = routes();
    assert!(routes.len() >= 8, "{routes:?}");
    assert!(routes.contains(&("/mcp".into(), "post".into())));
    let doc = documented();
    let missing: Vec<_> = routes.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&routes).collect();
    assert!(
        missing.is_empty(),
        "routes missing from docs/api.yaml: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "docs/api.yaml describes routes the server lacks: {extra:?}"
    );
    assert!(read("docs/api.yaml").starts_with("openapi: 3."));
}

#[test]
fn remote_provider_yaml_is_the_worker_router() {
    // A sandpit worker serves exactly the sandbox API the `remote` provider speaks.
    let routes = routes_in(&read("src/server/worker/api.rs"));
    assert!(
        routes.contains(&("/v1/capacity".into(), "get".into())),
        "{routes:?}"
    );
    assert_eq!(
        routes,
        documented_in("docs/remote-provider.yaml"),
        "src/server/worker/api.rs router vs docs/remote-provider.yaml"
    );
}

/// Keys of a record as the log stores it.
fn keys(rec: &LogRecord) -> BTreeSet<String> {
    let line = sandpit::journal::log::to_line(rec).expect("serialize");
    match serde_json::from_slice(&line) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        other => panic!("{other:?}"),
    }
}

/// Field names in the table rows of one `## heading` section of the doc.
fn doc_fields(doc: &str, heading: &str) -> BTreeSet<String> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("no section {heading}"));
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn statement_log_doc_covers_every_field() {
    // Every optional field set, so every key the writer can emit is serialized.
    let st = LogRecord::Statement(StatementRecord {
        seq: 1,
        ts: "2026-01-01T00:00:00Z".into(),
        token: "sp_x".into(),
        task: "t".into(),
        session: 1,
        protocol: "extended".into(),
        // Long enough to be stored cut, with its length and digest.
        text: format!(
            "select $1 -- {}",
            "x".repeat(sandpit::journal::log::TEXT_MAX)
        ),
        params: vec![Some("1".into()), None],
        kind: "read".into(),
    });
    let out = LogRecord::Outcome(OutcomeRecord {
        seq: 1,
        ts: "2026-01-01T00:00:00Z".into(),
        rows: Some(1),
        capped: true,
        duration_ms: 1.0,
        sqlstate: Some("42501".into()),
        tag: None,
        skipped: true,
        denied: true,
        kind: Some("write".into()),
    });
    let doc = read("docs/statement-log.md");
    assert_eq!(doc_fields(&doc, "`statement`"), keys(&st));
    assert_eq!(doc_fields(&doc, "`outcome`"), keys(&out));
}

/// Keys of config/sandpit.toml, commented-out ones included, as `section.key`.
fn example_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut section = String::new();
    for l in read("config/sandpit.toml").lines() {
        let l = l.trim();
        if let Some(s) = l.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = format!("{s}.");
            continue;
        }
        let l = l.strip_prefix('#').map(str::trim_start).unwrap_or(l);
        if let Some((k, _)) = l.split_once(" = ") {
            if !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                out.insert(format!("{section}{k}"));
            }
        }
    }
    out
}

/// The configuration reference's table keys (docs/configuration.md).
fn reference_keys() -> BTreeSet<String> {
    let doc = read("docs/configuration.md");
    let table = doc
        .split("<!-- config-reference:start -->")
        .nth(1)
        .and_then(|t| t.split("<!-- config-reference:end -->").next())
        .expect("docs/configuration.md has the config-reference markers");
    table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

/// The fields serde expects in a TOML table, read from its unknown-field error (so this
/// follows the struct, not a list kept by hand). None when `prefix` is not a table.
fn struct_fields(prefix: &str) -> Option<Vec<String>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("probe.toml");
    std::fs::write(&p, format!("{prefix}zz_not_a_key = 1\n")).expect("write");
    let err = sandpit::config::Config::load(Some(&p)).err()?.to_string();
    // "unknown field `zz_not_a_key`, expected one of `a`, `b`" (or "expected `a`" for one).
    let after = err
        .split("unknown field `zz_not_a_key`, expected ")
        .nth(1)?;
    let list = after.strip_prefix("one of ").unwrap_or(after);
    // Two fields read "expected `a` or `b`".
    let list = list.lines().next().unwrap_or("").replace("` or `", "`, `");
    Some(
        list.split(',')
            .map(|f| f.trim().trim_matches('`').to_string())
            .filter(|f| !f.is_empty())
            .collect(),
    )
}

fn config_struct_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let top = struct_fields("").expect("top-level fields");
    for f in top {
        match struct_fields(&format!("[{f}]\n")) {
            Some(sub) => out.extend(sub.into_iter().map(|s| format!("{f}.{s}"))),
            None => {
                out.insert(f);
            }
        }
    }
    out
}

#[test]
fn config_reference_matches_example_and_struct() {
    let example = example_keys();
    let readme = reference_keys();
    let code = config_struct_keys();
    assert!(code.len() >= 20, "{code:?}");
    assert_eq!(
        readme, example,
        "docs/configuration.md reference vs config/sandpit.toml"
    );
    assert_eq!(example, code, "config/sandpit.toml vs the Config struct");
    // The example's values are the defaults it says they are.
    let loaded = sandpit::config::Config::load(Some(&Path::new(ROOT).join("config/sandpit.toml")))
        .expect("load example");
    assert_eq!(
        format!("{loaded:?}"),
        format!("{:?}", sandpit::config::Config::default())
    );
}

#[test]
fn clients_doc_names_every_mcp_tool() {
    let doc = read("docs/clients.md");
    for t in sandpit::mcp::TOOL_NAMES {
        assert!(
            doc.contains(&format!("| `{t}` |")),
            "docs/clients.md lacks {t}"
        );
    }
    assert!(read("docs/api.yaml").contains(&format!("`{}`", sandpit::mcp::TOOL_NAMES[0])));
}

/// Metric names the code records: the string literal after `counter!(`, `gauge!(` or
/// `histogram!(` in every source file (the describe macros take names from a table).
fn recorded_metrics() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).expect("read src").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let src = std::fs::read_to_string(&p).expect("read source");
                for mac in ["counter!(", "gauge!(", "histogram!("] {
                    for (i, _) in src.match_indices(mac) {
                        let rest = src[i + mac.len()..].trim_start();
                        if let Some(lit) = rest.strip_prefix('"') {
                            let name = lit.split('"').next().unwrap_or("");
                            out.insert(name.to_string());
                        }
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&Path::new(ROOT).join("src"), &mut out);
    out
}

/// Metric names in the metrics table of docs/operations.md.
fn documented_metrics() -> BTreeSet<String> {
    let doc = read("docs/operations.md");
    let section = doc
        .split("\n### Metrics\n")
        .nth(1)
        .and_then(|s| s.split("\n### ").next())
        .expect("docs/operations.md has a Metrics section");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_metric_is_in_the_operations_table_and_described() {
    let code = recorded_metrics();
    assert!(code.len() >= 30, "{code:?}");
    assert!(code.iter().all(|n| n.starts_with("sandpit_")), "{code:?}");
    let readme = documented_metrics();
    let described: BTreeSet<String> = sandpit::control::METRICS
        .iter()
        .map(|m| m.0.to_string())
        .collect();
    let undocumented: Vec<_> = code.difference(&readme).collect();
    assert!(
        undocumented.is_empty(),
        "metrics missing from docs/operations.md's table: {undocumented:?}"
    );
    let undescribed: Vec<_> = code.difference(&described).collect();
    assert!(
        undescribed.is_empty(),
        "metrics missing from control::METRICS (# HELP): {undescribed:?}"
    );
    assert_eq!(
        readme, described,
        "docs/operations.md table vs control::METRICS"
    );
    let unused: Vec<_> = described.difference(&code).collect();
    assert!(
        unused.is_empty(),
        "described but never recorded: {unused:?}"
    );
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, other punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' | '-' => Some('-'),
            c if c.is_alphanumeric() || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks).
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for l in doc.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && l.starts_with('#') {
            out.insert(anchor(l));
        }
    }
    out
}

/// Relative link targets `](target)` in a markdown file (no scheme, no `mailto:`).
fn relative_links(doc: &str) -> Vec<String> {
    doc.split("](")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .filter(|t| !t.contains("://") && !t.starts_with("mailto:"))
        .map(str::to_string)
        .collect()
}

/// README.md and every docs/*.md, as (path relative to the root, text).
fn markdown_docs() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_string(), read("README.md"))];
    let mut names: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("read docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    for n in names {
        let rel = format!("docs/{n}");
        let text = read(&rel);
        out.push((rel, text));
    }
    out
}

#[test]
fn readme_is_a_front_page_whose_index_reaches_every_doc() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines (a front page: at most 250)"
    );
    let index = readme
        .split("\n## Index\n")
        .nth(1)
        .expect("README has an Index section");
    let docs = markdown_docs();
    assert!(
        docs.len() >= 10,
        "{:?}",
        docs.iter().map(|d| &d.0).collect::<Vec<_>>()
    );
    for (rel, _) in docs.iter().skip(1) {
        assert!(
            index.contains(&format!("]({rel})")),
            "README's index does not link {rel}"
        );
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let docs = markdown_docs();
    let by_path: BTreeMap<&str, BTreeSet<String>> = docs
        .iter()
        .map(|(rel, text)| (rel.as_str(), anchors(text)))
        .collect();
    let mut bad = Vec::new();
    for (rel, text) in &docs {
        let dir = Path::new(rel).parent().unwrap_or(Path::new(""));
        for link in relative_links(text) {
            let (file, frag) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                rel.clone()
            } else {
                // Normalised against the linking file's folder (`docs/x.md` from README).
                let joined = dir.join(file);
                joined.to_string_lossy().into_owned()
            };
            if !Path::new(ROOT).join(&target).exists() {
                bad.push(format!("{rel}: ({link}) names a missing file"));
                continue;
            }
            if frag.is_empty() {
                continue;
            }
            match by_path.get(target.as_str()) {
                Some(a) if a.contains(frag) => {}
                Some(_) => bad.push(format!("{rel}: ({link}) names a missing heading")),
                None => bad.push(format!(
                    "{rel}: ({link}) has an anchor into a non-markdown file"
                )),
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
    // The check can fail: a made-up anchor is caught.
    assert!(!anchors(&read("README.md")).contains("no-such-heading"));
    assert!(anchors("## Review: what did the agent change?\n")
        .contains("review-what-did-the-agent-change"));
}
