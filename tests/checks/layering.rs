//! One-way layering: every `crate::X` path in `src/**/*.rs` is checked against the modules
//! X's file may use. A module imports only those below it; an upward import fails this test
//! with the file and the path. (The layout came from a design note kept outside the
//! repository; the table below is the reference.) Inside a module, a folder's parts must not
//! import each other in a circle, and no file is attached with `#[path]`.
//!
//! Run: `cargo test --locked --test checks layering::`.
//!
//! `config` is read by nearly everything, so it sits low: it may name the journal's default
//! quota, `pgconn`'s sslmode and `pg`'s binaries, nothing above.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each top-level module may use, from the top of the layout down. `main.rs` is the
/// binary (it reaches the library as `sandpit::`, so it has no `crate::` paths to check).
#[rustfmt::skip]
const ALLOWED: &[(&str, &[&str])] = &[
    // Wires the pieces together: the only place that knows all of them.
    ("server", &["control", "mcp", "promote", "proxy", "lifecycle", "review", "journal", "registry",
                 "provider", "pgconn", "pg", "wire", "auth", "config", "datadir", "rfc3339"]),
    // The CLI's helpers, next to main.rs.
    ("cli", &["control", "auth", "config"]),
    ("control", &["mcp", "promote", "lifecycle", "review", "journal", "registry", "provider", "pgconn",
                  "pg", "wire", "auth", "config", "datadir", "rfc3339"]),
    // Review decisions and promotion: reads reviews, reaches backends; called at a token's
    // end through the hook that server.rs sets up.
    ("promote", &["lifecycle", "review", "journal", "registry", "provider", "pgconn", "wire",
                  "auth", "config", "datadir", "rfc3339"]),
    ("mcp", &["proxy", "lifecycle", "review", "journal", "registry", "provider", "pgconn",
              "wire", "auth", "config", "rfc3339"]),
    ("proxy", &["lifecycle", "journal", "registry", "provider", "pgconn", "wire", "auth",
                "config", "datadir", "rfc3339"]),
    ("lifecycle", &["journal", "registry", "provider", "pgconn", "auth", "config", "datadir",
                    "rfc3339"]),
    ("review", &["journal", "registry", "provider", "pgconn", "wire", "auth", "config", "datadir",
                 "rfc3339"]),
    // Read by nearly everything, so low (see the top of this file).
    ("config", &["journal", "pgconn", "pg", "datadir"]),
    ("journal", &["datadir", "rfc3339"]),
    ("registry", &["pgconn", "wire", "auth", "datadir", "rfc3339"]),
    ("provider", &["pgconn", "pg", "wire", "auth", "datadir", "rfc3339"]),
    ("pgconn", &["wire"]),
    ("pg", &[]),
    ("wire", &[]),
    ("auth", &[]),
    ("datadir", &[]),
    ("rfc3339", &[]),
];

/// The module a file (path relative to `src/`) belongs to: its directory, or for a
/// top-level file its stem.
fn module_of_file(rel: &Path) -> Option<String> {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let first = parts.first()?;
    if parts.len() >= 2 {
        return Some(first.clone());
    }
    // A top-level file `x.rs` is module `x` (no #[path] parts: see `no_path_attributes`).
    let stem = first.trim_end_matches(".rs");
    if stem == "lib" || stem == "main" {
        return None;
    }
    Some(stem.to_string())
}

/// The module a `crate::` path names (its first segment).
fn module_of_path(segments: &[String]) -> Option<String> {
    segments.first().cloned()
}

/// Source text with comments and string/char literals blanked, so a path in a doc line
/// or a message is not taken for an import.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map(|n| i + n).unwrap_or(b.len());
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map(|n| i + n + 2).unwrap_or(b.len());
            i = end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].bytes().take_while(|&c| c == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = i + 2 + hashes;
            let end = src[body..]
                .find(&close)
                .map(|n| body + n + close.len())
                .unwrap_or(b.len());
            out.push(' ');
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            out.push(' ');
            i = j + 1;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\'', '\n'); lifetimes ('a) are left alone.
            let end = src[i + 1..]
                .find('\'')
                .map(|n| {
                    if b[i + 1] == b'\\' && b.get(i + 2) == Some(&b'\'') {
                        i + 4
                    } else {
                        i + 1 + n + 1
                    }
                })
                .unwrap_or(b.len());
            out.push(' ');
            i = end;
        } else {
            let ch = rest.chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths after `crate::` in `code`, each as its segments; a group `crate::{a::b, c}`
/// gives one path per item.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(n) = code[from..].find("crate::") {
        let at = from + n;
        from = at + "crate::".len();
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident(c) || c == '$')
        {
            continue; // `$crate::` or a longer name ending in `crate`
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        item.push(c)
                    }
                    '}' if depth == 0 => break,
                    '}' => {
                        depth -= 1;
                        item.push(c)
                    }
                    ',' if depth == 0 => {
                        out.push(segments(&item));
                        item.clear();
                    }
                    c => item.push(c),
                }
            }
            out.push(segments(&item));
        } else {
            out.push(segments(rest));
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

fn segments(s: &str) -> Vec<String> {
    let mut segs = Vec::new();
    let mut rest = s.trim_start();
    loop {
        let len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        segs.push(rest[..len].to_string());
        match rest[len..].trim_start().strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => break,
        }
    }
    segs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The modules `lib.rs` declares.
fn lib_modules(lib: &str) -> BTreeSet<String> {
    code_only(lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")
                .map(|m| m.trim_end_matches(';').trim().to_string())
        })
        .collect()
}

/// Every upward (or unlisted) use in `files` (path relative to src, text), as messages.
fn violations(files: &[(PathBuf, String)], modules: &BTreeSet<String>) -> Vec<String> {
    let table: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, deps)| (*m, deps.iter().copied().collect()))
        .collect();
    let mut bad = Vec::new();
    for (rel, text) in files {
        let Some(from) = module_of_file(rel) else {
            continue;
        };
        let Some(allowed) = table.get(from.as_str()) else {
            bad.push(format!(
                "{}: module `{from}` has no row in the layering table (place it in the layout)",
                rel.display()
            ));
            continue;
        };
        for path in crate_paths(&code_only(text)) {
            let Some(to) = module_of_path(&path) else {
                continue;
            };
            if to == from || !modules.contains(&to) {
                continue; // within the module, or an item of lib.rs itself
            }
            if !allowed.contains(to.as_str()) {
                bad.push(format!(
                    "{}: `{from}` uses `crate::{}`, but may use only {:?}",
                    rel.display(),
                    path.join("::"),
                    allowed
                ));
            }
        }
    }
    bad
}

fn sources() -> (Vec<(PathBuf, String)>, BTreeSet<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    let files: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("reading a source file");
            (p.strip_prefix(&src).expect("under src").to_path_buf(), text)
        })
        .collect();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("reading lib.rs");
    (files, lib_modules(&lib))
}

#[test]
fn no_module_imports_one_above_it() {
    let (files, modules) = sources();
    assert!(files.len() > 50, "found only {} source files", files.len());
    assert!(
        modules.contains("proxy") && modules.contains("pgconn"),
        "{modules:?}"
    );
    let bad = violations(&files, &modules);
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
}

#[test]
fn every_module_has_a_row() {
    let (_, modules) = sources();
    for m in &modules {
        assert!(
            ALLOWED.iter().any(|(row, _)| row == m),
            "module `{m}` has no row in the layering table"
        );
    }
}

#[test]
fn an_upward_import_is_caught() {
    let (_, modules) = sources();
    let upward = [
        ("pg/mod.rs", "use crate::provider::ProviderError;"),
        (
            "registry/postgres.rs",
            "fn f() { crate::lifecycle::state_word(s) }",
        ),
        (
            "review/store.rs",
            "use crate::{config::Config, lifecycle::Gateway};",
        ),
        ("journal/log.rs", "use crate::review::reviewer::Reviewer;"),
        (
            "journal/classify/mod.rs",
            "use crate::proxy::caps::ResultCount;",
        ),
        (
            "journal/log/read/mod.rs",
            "use crate::{datadir, config::Config};",
        ),
        ("journal/mod.rs", "pub use crate::wire::frame;"),
        ("pgconn/stream.rs", "use crate::provider::{tls, Endpoint};"),
        ("mcp/http.rs", "use crate::control::ApiState;"),
    ];
    for (file, text) in upward {
        let bad = violations(&[(PathBuf::from(file), text.to_string())], &modules);
        assert_eq!(bad.len(), 1, "{file}: {text} gave {bad:?}");
    }
    // Not imports: comments, strings, a macro's `$crate`, and uses within the module.
    let fine = [
        (
            "pg/mod.rs",
            "// see crate::provider::ProviderError\nlet s = \"crate::server\";",
        ),
        (
            "wire/frame.rs",
            "macro_rules! m { () => { $crate::wire::frame::build } }",
        ),
        (
            "proxy/session/mod.rs",
            "use crate::proxy::caps; use crate::journal::log::TokenLog;",
        ),
        ("journal/classify/words.rs", "use crate::datadir;"),
        (
            "journal/log.rs",
            "use crate::journal::classify::Kind; use crate::rfc3339;",
        ),
        (
            "review/store.rs",
            "use crate::journal::log::{LogRecord, TokenLog};",
        ),
    ];
    for (file, text) in fine {
        let bad = violations(&[(PathBuf::from(file), text.to_string())], &modules);
        assert!(bad.is_empty(), "{file}: {text} gave {bad:?}");
    }
}

#[test]
fn no_path_attributes() {
    // Parts of a module live in its folder.
    let (files, _) = sources();
    let with: Vec<String> = files
        .iter()
        .filter(|(_, text)| code_only(text).contains("#[path"))
        .map(|(rel, _)| rel.display().to_string())
        .collect();
    assert!(with.is_empty(), "#[path] in {with:?}");
    // The check sees an attribute, and not one in a comment or a string.
    assert!(code_only("#[path = \"x.rs\"]\nmod x;").contains("#[path"));
    assert!(!code_only("// #[path = \"x.rs\"]\nlet s = \"#[path]\";").contains("#[path"));
}

/// The module path of a file (relative to `src/`): `review/model.rs` → [review, model],
/// `proxy/session/mod.rs` → [proxy, session], `config.rs` → [config].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" && stem != "main" {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// The paths after `super::` (chains of `super::` counted) in `code`, each as (levels up,
/// segments); a group `super::{a, b::c}` gives one path per item.
fn super_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(n) = code[from..].find("super::") {
        let at = from + n;
        from = at + "super::".len();
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident(c) || c == ':')
        {
            continue; // the second `super` of a chain was counted with the first
        }
        let mut levels = 1;
        let mut rest = &code[from..];
        while let Some(r) = rest.strip_prefix("super::") {
            levels += 1;
            rest = r;
        }
        // Reuse the `crate::` parser on this path alone (on the whole remainder it would
        // also take every later `crate::` path for one under `super`).
        let mut depth = 0usize;
        let end = rest
            .char_indices()
            .find(|&(_, c)| match c {
                '{' => {
                    depth += 1;
                    false
                }
                '}' => {
                    depth = depth.saturating_sub(1);
                    depth == 0
                }
                c => depth == 0 && !(is_ident(c) || c == ':'),
            })
            .map_or(rest.len(), |(i, c)| if c == '}' { i + 1 } else { i });
        for segs in crate_paths(&format!("crate::{}", &rest[..end])) {
            out.push((levels, segs));
        }
    }
    out
}

/// The deepest module a path names, from `base` (segments beyond the last module are items).
fn resolve(src: &Path, base: &[String], segs: &[String]) -> Vec<String> {
    let mut m = base.to_vec();
    for s in segs {
        let mut dir = src.to_path_buf();
        for p in &m {
            dir.push(p);
        }
        let is_module =
            dir.join(format!("{s}.rs")).is_file() || dir.join(s).join("mod.rs").is_file();
        if !is_module {
            break;
        }
        m.push(s.clone());
    }
    m
}

/// Edges between the parts of each folder: (folder, from part, to part, file that imports).
/// A part is a file or sub-folder directly inside the folder; `mod.rs` (the folder's face,
/// which declares and re-exports its parts) is none. Inline `mod tests { … }` at a file's end
/// is left out: its `super::` is the file itself.
fn part_edges(
    src: &Path,
    files: &[(PathBuf, String)],
) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeMap<String, String>>> {
    let mut edges: BTreeMap<Vec<String>, BTreeMap<String, BTreeMap<String, String>>> =
        BTreeMap::new();
    for (rel, text) in files {
        let me = module_path(rel);
        let code = code_only(text);
        let code = code
            .find("mod tests {")
            .map(|i| &code[..i])
            .unwrap_or(&code);
        let mut targets = Vec::new();
        for p in crate_paths(code) {
            targets.push(resolve(src, &[], &p));
        }
        for (up, p) in super_paths(code) {
            // `super` of `a/b.rs` and of `a/b/mod.rs` alike is `a`.
            if up > me.len() {
                continue;
            }
            targets.push(resolve(src, &me[..me.len() - up], &p));
        }
        for t in targets {
            // The deepest folder holding both, and the part of it each lies in.
            let common = me.iter().zip(&t).take_while(|(a, b)| a == b).count();
            if common >= me.len() || common >= t.len() {
                continue; // one contains the other: a face and its parts
            }
            let folder = me[..common].to_vec();
            edges
                .entry(folder)
                .or_default()
                .entry(me[common].clone())
                .or_default()
                .entry(t[common].clone())
                .or_insert_with(|| rel.display().to_string());
        }
    }
    edges
}

/// Every circle among a folder's parts, as the parts in order (each circle once, from its
/// smallest part).
fn circles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeMap<String, String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        out: &mut BTreeSet<Vec<String>>,
    ) {
        for next in graph.get(at).map(|m| m.keys()).into_iter().flatten() {
            if next == start {
                out.insert(path.clone());
            } else if next.as_str() > start && !path.contains(next) && path.len() < 12 {
                path.push(next.clone());
                walk(graph, start, next, path, out);
                path.pop();
            }
        }
    }
    let mut out = BTreeSet::new();
    for start in graph.keys() {
        walk(graph, start, start, &mut vec![start.clone()], &mut out);
    }
    out.into_iter().collect()
}

/// The parts of a folder that import each other in a circle (strongly connected, more
/// than one), each set sorted.
fn tangles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for next in graph.get(&n).map(|m| m.keys()).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (a, from_a) in &reached {
        let scc: BTreeSet<String> = from_a
            .iter()
            .filter(|b| reached.get(b).is_some_and(|r| r.contains(*a)))
            .cloned()
            .collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

/// Circles inside modules that predate this check, allowed to shrink but not to grow. None
/// is left (issue 31 removed the last); a row here is a debt, not a way to add a circle.
const KNOWN_TANGLES: &[(&str, &[&str])] = &[];

/// Each circle among a folder's parts that is not inside a known tangle, as a message
/// naming its parts and the files that import.
fn new_circles(
    edges: &BTreeMap<Vec<String>, BTreeMap<String, BTreeMap<String, String>>>,
    known: &[(&str, &[&str])],
) -> Vec<String> {
    let mut bad = Vec::new();
    for (folder, graph) in edges {
        let name = folder.join("/");
        for scc in tangles(graph) {
            let allowed = known
                .iter()
                .any(|(f, parts)| *f == name && scc.iter().all(|p| parts.contains(&p.as_str())));
            if allowed {
                continue;
            }
            let via: Vec<String> = circles(graph)
                .into_iter()
                .filter(|c| c.iter().all(|p| scc.contains(p)))
                .take(3)
                .map(|c| {
                    (0..c.len())
                        .map(|i| {
                            let (a, b) = (&c[i], &c[(i + 1) % c.len()]);
                            format!("{a} -> {b} ({})", graph[a][b])
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .collect();
            bad.push(format!(
                "src/{name}: {scc:?} import each other: {}",
                via.join("; ")
            ));
        }
    }
    bad
}

#[test]
fn no_new_circle_inside_a_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (files, _) = sources();
    let edges = part_edges(&src, &files);
    // The check sees the imports between a folder's parts (it reads `super::` and `crate::`).
    assert!(
        edges
            .get(&vec!["review".to_string()])
            .and_then(|g| g.get("diff"))
            .is_some_and(|to| to.contains_key("schema") && to.contains_key("sql")),
        "{edges:?}"
    );
    let bad = new_circles(&edges, KNOWN_TANGLES);
    assert!(
        bad.is_empty(),
        "circles inside modules:\n{}",
        bad.join("\n")
    );
    // Every known tangle is still there (else its row goes): say which are gone.
    for (folder, parts) in KNOWN_TANGLES {
        let key: Vec<String> = folder.split('/').map(str::to_string).collect();
        let still = edges.get(&key).is_some_and(|g| {
            tangles(g)
                .iter()
                .any(|s| s.iter().any(|p| parts.contains(&p.as_str())))
        });
        if !still {
            println!("src/{folder}: the circle among {parts:?} is gone; remove its row");
        }
    }
}

#[test]
fn a_circle_inside_a_module_is_caught() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (mut files, _) = sources();
    // proxy/caps.rs naming proxy/relay/, which already reaches caps: a new circle.
    files.push((
        PathBuf::from("proxy/caps.rs"),
        "use super::relay::Anything;".to_string(),
    ));
    let bad = new_circles(&part_edges(&src, &files), KNOWN_TANGLES);
    assert!(
        bad.len() == 1 && bad[0].starts_with("src/proxy:") && bad[0].contains("caps -> relay"),
        "{bad:?}"
    );
    // A part naming its folder's face (through `crate::` or `super::super::`) is no circle.
    let (mut files, _) = sources();
    files.push((
        PathBuf::from("proxy/session/error.rs"),
        "fn f() { crate::proxy::session::Session::x() }".to_string(),
    ));
    files.push((
        PathBuf::from("proxy/session/error.rs"),
        "use super::super::session::Session;".to_string(),
    ));
    let edges = part_edges(&src, &files);
    assert!(
        new_circles(&edges, KNOWN_TANGLES).is_empty(),
        "a face and its part: no circle"
    );
    // A `crate::` path into a sibling's sub-folder counts as that sibling.
    let (mut files, _) = sources();
    files.push((
        PathBuf::from("proxy/caps.rs"),
        "use crate::proxy::session::error::SessionError;".to_string(),
    ));
    let bad = new_circles(&part_edges(&src, &files), KNOWN_TANGLES);
    assert!(
        bad.len() == 1 && bad[0].contains("caps -> session"),
        "{bad:?}"
    );
    // A known tangle is allowed; grown, it is caught (one made for the test: ending and
    // janitor naming each other).
    let made: &[&str] = &["ending", "janitor"];
    let known: Vec<(&str, &[&str])> = KNOWN_TANGLES
        .iter()
        .copied()
        .chain([("lifecycle", made)])
        .collect();
    let (mut files, _) = sources();
    files.push((
        PathBuf::from("lifecycle/ending.rs"),
        "use super::janitor::x;".to_string(),
    ));
    files.push((
        PathBuf::from("lifecycle/janitor.rs"),
        "use super::ending::x;".to_string(),
    ));
    let bad = new_circles(&part_edges(&src, &files), &known);
    assert!(bad.is_empty(), "{bad:?}");
    files.push((
        PathBuf::from("lifecycle/janitor.rs"),
        "use super::issue::x;".to_string(),
    ));
    files.push((
        PathBuf::from("lifecycle/issue.rs"),
        "use super::ending::x;".to_string(),
    ));
    let bad = new_circles(&part_edges(&src, &files), &known);
    assert_eq!(bad.len(), 1, "{bad:?}");
}
