//! The TOML configs the ConfigMaps are generated from, rendered as the pods' init containers
//! render them: they load, validate and pass `serve --check-config`.

use std::collections::BTreeMap;
use std::process::Command;

use super::{files, read};

/// Placeholders `__NAME__` in a config, in order of first appearance.
pub(super) fn placeholders(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("__") {
        let after = &rest[i + 2..];
        match after.find("__") {
            Some(j)
                if j > 0
                    && after[..j]
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c == '_') =>
            {
                let name = after[..j].to_string();
                if !out.contains(&name) {
                    out.push(name);
                }
                rest = &after[j + 2..];
            }
            _ => rest = after,
        }
    }
    out
}

/// A config with its placeholders filled in, as the init container's sed fills them.
pub(super) fn render(text: &str, values: &BTreeMap<&str, String>) -> String {
    let mut t = text.to_string();
    for p in placeholders(text) {
        let v = values
            .get(p.as_str())
            .unwrap_or_else(|| panic!("no test value for the placeholder __{p}__"));
        t = t.replace(&format!("__{p}__"), v);
    }
    t
}

/// What the test puts in for each placeholder (the registry password as `openssl rand -hex`
/// gives it).
pub(super) fn test_values(pod: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("REGISTRY_PASSWORD", "0123456789abcdef".repeat(4)),
        ("POD_NAME", pod.to_string()),
    ])
}

pub(super) fn load_config(text: &str, origin: &str) -> sandpit::config::Config {
    let tmp = tempfile::tempdir().expect("tempdir");
    let p = tmp.path().join("c.toml");
    std::fs::write(&p, text).expect("write config");
    let cfg = sandpit::config::Config::load(Some(&p)).unwrap_or_else(|e| panic!("{origin}: {e}"));
    cfg.validate().unwrap_or_else(|e| panic!("{origin}: {e}"));
    cfg
}

/// `serve --check-config` on the rendered config, with every absolute path it names moved
/// into a temporary root where the files exist (empty) and the data dir can be made.
fn check_config(text: &str, env: &[(&str, &str)], origin: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().to_str().expect("utf-8 temp path");
    let moved = text
        .replace("\"/etc/", &format!("\"{root}/etc/"))
        .replace("\"/var/", &format!("\"{root}/var/"));
    let cfg = load_config(&moved, origin);
    let named = [
        cfg.tls.cert.clone(),
        cfg.tls.key.clone(),
        cfg.remote.ca_file.clone(),
        cfg.registry.ca_file.clone(),
        cfg.golden.sql.clone(),
    ];
    for p in named.into_iter().flatten() {
        assert!(
            p.starts_with(root),
            "{origin}: {} is not moved",
            p.display()
        );
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, "").expect("write");
    }
    let conf = tmp.path().join("config.toml");
    std::fs::write(&conf, &moved).expect("write config");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandpit"));
    cmd.args(["serve", "--check-config", "--config"])
        .arg(&conf)
        .args(["--log-format", "json"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("SANDPIT_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run sandpit serve --check-config");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("config ok"),
        "{origin}: serve --check-config:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn configs_load_validate_and_pass_check_config_as_the_pods_render_them() {
    assert_eq!(files("toml"), ["front.toml", "worker.toml"]);
    let key = "k".repeat(64);
    // The front.
    let front = render(&read("front.toml"), &test_values("unused"));
    assert!(placeholders(&front).is_empty(), "{front}");
    let cfg = load_config(&front, "front.toml");
    assert_eq!(cfg.provider, "remote");
    assert!(cfg.worker.listen.is_none(), "a front is not a worker");
    assert!(cfg.remote.url.is_none() && cfg.remote.urls.len() >= 2);
    assert!(
        cfg.registry.url.is_some(),
        "fronts share tokens through the registry"
    );
    assert!(
        cfg.admin_key.is_none() && cfg.remote.api_key.is_none(),
        "keys come from Secrets"
    );
    check_config(&front, &[("SANDPIT_ADMIN_KEY", key.as_str())], "front.toml");
    // Each worker pod renders its own.
    for pod in ["sandpit-worker-0", "sandpit-worker-1"] {
        let text = render(&read("worker.toml"), &test_values(pod));
        let cfg = load_config(&text, "worker.toml");
        // What `serve` checks before it runs as a worker (src/server/worker/mod.rs).
        assert!(cfg.worker.listen.is_some());
        assert_eq!(cfg.provider, "instance");
        assert!(cfg.worker.api_key.is_none(), "the key comes from a Secret");
        assert!(cfg.registry.url.is_none(), "workers need no registry");
        assert_eq!(
            cfg.worker.host.as_deref(),
            Some(format!("{pod}.sandpit-worker").as_str())
        );
        check_config(
            &text,
            &[("SANDPIT_WORKER_API_KEY", key.as_str())],
            "worker.toml",
        );
    }
}
