//! Every manifest validates against the Kubernetes schemas of one fixed version (strict).

use std::process::Command;

use super::{dir, manifest_files, python, python_has, KUBERNETES};
use crate::support::require;

#[test]
fn manifests_validate_against_the_kubernetes_schemas() {
    if !require::require(
        python_has("kubernetes_validate"),
        "kubernetes-validate",
        &format!("{} cannot import kubernetes_validate", python()),
    ) {
        return;
    }
    let manifests = manifest_files();
    assert!(manifests.len() >= 4, "{manifests:?}");
    let out = Command::new(python())
        .args([
            "-m",
            "kubernetes_validate",
            "--strict",
            "--quiet",
            "-k",
            KUBERNETES,
        ])
        .args(&manifests)
        .current_dir(dir())
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("ERROR"),
        "kubernetes-validate -k {KUBERNETES} --strict:\n{text}"
    );
}
