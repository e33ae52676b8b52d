//! One-way layering (docs: ../shared/DESIGN.md "Layout (target)"): every `crate::X` path in
//! `src/**/*.rs` is checked against the modules X's file may use. A module imports only
//! those below it; an upward import fails this test with the file and the path.
//!
//! Run: `cargo test --locked --test layering`.
//!
//! `config` (with its `config_*.rs` parts) is read by nearly
//! everything, so it sits low: it may name the journal's default quota, `pgconn`'s
//! sslmode and `pg`'s binaries, nothing above.

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
fn module_of_file(rel: &Path, modules: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let first = parts.first()?;
    if parts.len() >= 2 {
        return Some(first.clone());
    }
    // A top-level file: `x.rs`, or a part of `x` included with #[path] (`x_tests.rs`).
    let stem = first.trim_end_matches(".rs");
    if stem == "lib" || stem == "main" {
        return None;
    }
    modules
        .iter()
        .filter(|m| stem == m.as_str() || stem.starts_with(&format!("{m}_")))
        .max_by_key(|m| m.len())
        .cloned()
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
        let Some(from) = module_of_file(rel, modules) else {
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
        ("journal/log.rs", "use crate::review::store::Reviewer;"),
        (
            "journal/classify.rs",
            "use crate::proxy::caps::ResultCount;",
        ),
        (
            "journal/log/read.rs",
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
            "proxy/session.rs",
            "use crate::proxy::caps; use crate::journal::log::TokenLog;",
        ),
        ("journal/classify.rs", "use crate::datadir;"),
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
