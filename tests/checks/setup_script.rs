//! scripts/setup-dev.sh, the README's set-up line: it parses, it asks for a toolchain as new
//! as the locked crates need, CI runs it instead of installing things itself, and on a
//! machine it has set up (CI) its `--check` finds nothing missing.

use crate::support::require;

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `1.88` and `1.88.0` alike: three numbers.
fn version(v: &str) -> [u32; 3] {
    let mut out = [0; 3];
    for (o, p) in out.iter_mut().zip(v.split('.')) {
        *o = p.parse().unwrap_or(0);
    }
    out
}

/// `rust-version = "…"` of a Cargo.toml.
fn rust_version(toml: &str) -> Option<String> {
    toml.lines()
        .find_map(|l| l.trim().strip_prefix("rust-version"))
        .and_then(|r| r.split('"').nth(1))
        .map(str::to_string)
}

#[test]
fn the_script_parses_and_ci_and_the_readme_use_it() {
    let out = Command::new("bash")
        .args(["-n", "scripts/setup-dev.sh"])
        .current_dir(ROOT)
        .output()
        .expect("bash -n");
    assert!(out.status.success(), "{out:?}");
    let ci = read(".ci/run");
    assert!(ci.contains("\nbash scripts/setup-dev.sh\n"), "{ci}");
    // Installing is the script's job; CI kills nothing by name.
    for gone in [
        "apt-get install",
        "pip install",
        "npm ci",
        "pkill",
        "killall",
    ] {
        assert!(!ci.contains(gone), ".ci/run still has {gone:?}");
    }
    let script = read("scripts/setup-dev.sh");
    for gone in ["pkill", "killall"] {
        assert!(!script.contains(gone), "setup-dev.sh has {gone:?}");
    }
    // The quick start: the set-up line, then the two commands.
    let readme = read("README.md");
    let block = readme
        .split("## Quick start")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("quick start block");
    let cmds: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .collect();
    assert_eq!(
        cmds,
        [
            "bash scripts/setup-dev.sh",
            "cargo run --release -- serve",
            "cargo test"
        ]
    );
    assert!(read(".gitignore").lines().any(|l| l == ".venv/"));
}

/// The toolchain the script installs when the system's is older than Cargo.toml's
/// rust-version is enough for every crate Cargo.lock pins (their sources, as fetched).
#[test]
fn rust_version_covers_every_locked_crate() {
    let ours = rust_version(&read("Cargo.toml")).expect("Cargo.toml has rust-version");
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let sources: Vec<PathBuf> = std::fs::read_dir(home.join("registry/src"))
        .expect("fetched crates")
        .flatten()
        .map(|e| e.path())
        .collect();
    let lock = read("Cargo.lock");
    let mut checked = 0;
    let mut too_new = Vec::new();
    for pkg in lock.split("[[package]]").skip(1) {
        let field = |k: &str| {
            pkg.lines()
                .find_map(|l| l.strip_prefix(&format!("{k} = \"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        let (Some(name), Some(ver)) = (field("name"), field("version")) else {
            continue;
        };
        if field("source").is_none() {
            continue; // this crate
        }
        let Some(toml) = sources
            .iter()
            .map(|s| s.join(format!("{name}-{ver}/Cargo.toml")))
            .find(|p| p.exists())
        else {
            continue; // a target-specific crate this machine never fetched
        };
        checked += 1;
        let text = std::fs::read_to_string(&toml).expect("read Cargo.toml");
        if let Some(rv) = rust_version(&text) {
            if version(&rv) > version(&ours) {
                too_new.push(format!("{name} {ver} needs {rv}"));
            }
        }
    }
    assert!(checked >= 100, "only {checked} locked crates found fetched");
    assert!(
        too_new.is_empty(),
        "rust-version {ours} is too old: {too_new:?}"
    );
}

/// On a machine the script has set up (CI runs it first) nothing is missing. Elsewhere this
/// says what a run of the script would install.
#[test]
fn nothing_is_missing_after_the_set_up() {
    let out = Command::new("bash")
        .args(["scripts/setup-dev.sh", "--check"])
        .current_dir(ROOT)
        .output()
        .expect("run setup-dev.sh --check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() || text.contains("setup-dev: missing: "),
        "{out:?}"
    );
    let _ = require::require(
        out.status.success(),
        "what scripts/setup-dev.sh installs",
        text.trim(),
    );
}
