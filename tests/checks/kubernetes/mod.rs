//! docker/kubernetes/cluster/, sandpit with Kubernetes as the engine (docs/kubernetes.md).
//! No cluster runs here, so three kinds of check stand in for one:
//! - every manifest validates against the Kubernetes schemas of one fixed version
//!   (`kubernetes-validate`, strict: unknown fields are errors);
//! - the TOML configs the ConfigMaps are generated from, rendered as the pods' init containers
//!   render them, load and validate as `sandpit serve` loads them, and pass
//!   `serve --check-config` with the files they name in place;
//! - what a schema cannot see: selectors that select, ConfigMaps and Secrets that exist,
//!   ports that agree between configs, containers, Services and NetworkPolicies, the fronts'
//!   `remote.urls` naming exactly the worker StatefulSet's pods, the doors' port range.
//!
//! The manifests are read as YAML by Python (PyYAML, which kubernetes-validate depends on);
//! a missing one skips those tests with the reason, or fails them under CI=true.
//! `schemas.rs`, `configs.rs` and `references.rs` hold the three kinds; `model.rs` reads the
//! manifests for the last two.

mod configs;
mod model;
mod references;
mod schemas;

use crate::support::require;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub(super) const ROOT: &str = env!("CARGO_MANIFEST_DIR");
pub(super) const DIR: &str = "docker/kubernetes/cluster";
/// The Kubernetes version the manifests are validated against.
pub(super) const KUBERNETES: &str = "1.32.0";

pub(super) fn dir() -> PathBuf {
    Path::new(ROOT).join(DIR)
}

pub(super) fn read(rel: &str) -> String {
    std::fs::read_to_string(dir().join(rel)).unwrap_or_else(|e| panic!("{DIR}/{rel}: {e}"))
}

pub(super) fn python() -> String {
    std::env::var("SANDPIT_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether `python -c code` runs (a module imports).
pub(super) fn python_has(module: &str) -> bool {
    Command::new(python())
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Files of the folder with this extension, sorted by name.
pub(super) fn files(ext: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir())
        .expect("read the cluster folder")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(&format!(".{ext}")))
        .collect();
    out.sort();
    out
}

/// The manifests: every YAML file but the kustomization.
pub(super) fn manifest_files() -> Vec<String> {
    files("yaml")
        .into_iter()
        .filter(|n| n != "kustomization.yaml")
        .collect()
}

pub(super) const LOAD_YAML: &str = r#"
import json, sys, yaml
out = {}
for p in sys.argv[1:]:
    with open(p) as f:
        out[p.rsplit("/", 1)[-1]] = [d for d in yaml.safe_load_all(f) if d is not None]
print(json.dumps(out))
"#;

/// Every YAML file of the folder, parsed: file name -> its documents. None (after saying
/// why) when PyYAML is missing outside CI.
pub(super) fn load_yaml() -> Option<BTreeMap<String, Vec<Value>>> {
    if !require::require(
        python_has("yaml"),
        "PyYAML (installed with kubernetes-validate)",
        &format!("{} cannot import yaml", python()),
    ) {
        return None;
    }
    let paths: Vec<PathBuf> = files("yaml").iter().map(|f| dir().join(f)).collect();
    let out = Command::new(python())
        .arg("-c")
        .arg(LOAD_YAML)
        .args(&paths)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "the YAML does not parse:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("JSON from python"))
}
