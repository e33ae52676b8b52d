//! The harness examples in `examples/` run against a real gateway, each on its SDK: Python on
//! clients/python (from its source; psycopg from the system), JavaScript on clients/typescript
//! (built here; linked into `examples/node` by its package-lock). `scripts/setup-dev.sh` installs psycopg
//! and runs `npm ci` in clients/typescript and `examples/node` first.

use std::path::Path;
use std::process::Command;

use crate::support::harness::{Gateway, SMALL_GOLDEN};
use serde_json::Value;

fn run_example(g: &Gateway, program: &str, script: &str, hint: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(program)
        .arg(root.join(script))
        .env("PYTHONPATH", root.join("clients/python/src"))
        .env("SANDPIT_API", &g.api)
        .env("SANDPIT_ADMIN_KEY", &g.admin_key)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}); {hint}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{script} failed ({hint}):\n{stdout}\n{stderr}"
    );
    stdout
}

fn assert_transcript(out: &str, who: &str) {
    for want in [
        "INSERT 0 500",
        "notes\n500\n(1 row)",
        "DELETE 500",
        "left_after_delete\n0\n(1 row)",
        "run_sql> select * from no_such_table\nERROR 42P01: ",
        "first task ended: token revoked",
        "notes_absent\ntrue\n(1 row)",
        "answer\n42\n(1 row)",
        "agent loop raised: the agent loop failed",
        "crashed task ended: token revoked",
    ] {
        assert!(out.contains(want), "{who}: no {want:?} in:\n{out}");
    }
    assert_eq!(out.lines().last(), Some("harness ok"), "{who}:\n{out}");
}

/// Every token the examples issued ended revoked, and no scratch database is left.
fn assert_all_cleaned(g: &Gateway, prefix: &str) {
    let (st, v) = g.raw_call("GET", "/v1/tokens", None);
    assert_eq!(st, 200);
    let mine: Vec<&Value> = v
        .as_array()
        .expect("list")
        .iter()
        .filter(|t| t["task"].as_str().is_some_and(|s| s.starts_with(prefix)))
        .collect();
    assert_eq!(mine.len(), 3, "{v}");
    for t in mine {
        assert_eq!(t["state"], "revoked", "{t}");
        assert_eq!(t["backend"], false, "{t}");
        let id = t["id"].as_str().expect("id");
        assert!(!g.instances_dir().join(id).exists(), "backend of {id} left");
    }
}

/// The TypeScript SDK's `dist/`, which `examples/node` links to, built from its source.
fn build_typescript_sdk() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/typescript");
    let hint = "needs node and `npm ci` in clients/typescript (bash .ci/run does)";
    let out = Command::new("npm")
        .args(["run", "build"])
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run npm ({e}); {hint}"));
    assert!(
        out.status.success(),
        "building clients/typescript failed ({hint}):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn python_and_node_harness_examples_run_green() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let py = run_example(
        &g,
        "python3",
        "examples/python/harness.py",
        "needs psycopg 3: pip install 'psycopg[binary]' (bash scripts/setup-dev.sh does)",
    );
    assert_transcript(&py, "python");
    assert_all_cleaned(&g, "py-example-");
    build_typescript_sdk();
    let node = run_example(
        &g,
        "node",
        "examples/node/harness.mjs",
        "needs node and `npm ci` in clients/typescript and examples/node (bash scripts/setup-dev.sh does)",
    );
    assert_transcript(&node, "node");
    assert_all_cleaned(&g, "node-example-");
}
