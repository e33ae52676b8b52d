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

use crate::support::require;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const DIR: &str = "docker/kubernetes/cluster";
/// The Kubernetes version the manifests are validated against.
const KUBERNETES: &str = "1.32.0";

fn dir() -> PathBuf {
    Path::new(ROOT).join(DIR)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(dir().join(rel)).unwrap_or_else(|e| panic!("{DIR}/{rel}: {e}"))
}

fn python() -> String {
    std::env::var("SANDPIT_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether `python -c code` runs (a module imports).
fn python_has(module: &str) -> bool {
    Command::new(python())
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Files of the folder with this extension, sorted by name.
fn files(ext: &str) -> Vec<String> {
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
fn manifest_files() -> Vec<String> {
    files("yaml")
        .into_iter()
        .filter(|n| n != "kustomization.yaml")
        .collect()
}

const LOAD_YAML: &str = r#"
import json, sys, yaml
out = {}
for p in sys.argv[1:]:
    with open(p) as f:
        out[p.rsplit("/", 1)[-1]] = [d for d in yaml.safe_load_all(f) if d is not None]
print(json.dumps(out))
"#;

/// Every YAML file of the folder, parsed: file name -> its documents. None (after saying
/// why) when PyYAML is missing outside CI.
fn load_yaml() -> Option<BTreeMap<String, Vec<Value>>> {
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

// --- The configs ---------------------------------------------------------------------------

/// Placeholders `__NAME__` in a config, in order of first appearance.
fn placeholders(text: &str) -> Vec<String> {
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
fn render(text: &str, values: &BTreeMap<&str, String>) -> String {
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
fn test_values(pod: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("REGISTRY_PASSWORD", "0123456789abcdef".repeat(4)),
        ("POD_NAME", pod.to_string()),
    ])
}

fn load_config(text: &str, origin: &str) -> sandpit::config::Config {
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

// --- Cross-references ------------------------------------------------------------------------

fn at<'a>(v: &'a Value, ptr: &str) -> &'a Value {
    v.pointer(ptr).unwrap_or(&Value::Null)
}

fn st<'a>(v: &'a Value, ptr: &str) -> &'a str {
    at(v, ptr).as_str().unwrap_or("")
}

fn arr<'a>(v: &'a Value, ptr: &str) -> &'a [Value] {
    at(v, ptr).as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// `sel` selects `pod` (every key of the selector has the pod's value).
fn selects(sel: &BTreeMap<String, String>, pod: &BTreeMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| pod.get(k) == Some(v))
}

fn port_of(addr: std::net::SocketAddr) -> i64 {
    i64::from(addr.port())
}

/// The manifests as the checks read them.
struct Cluster {
    docs: Vec<Value>,
}

impl Cluster {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| st(d, "/kind") == kind)
            .collect()
    }

    fn named(&self, kind: &str, name: &str) -> &Value {
        self.of_kind(kind)
            .into_iter()
            .find(|d| st(d, "/metadata/name") == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    fn workloads(&self) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| matches!(st(d, "/kind"), "Deployment" | "StatefulSet"))
            .collect()
    }

    /// The workloads whose pods `sel` selects.
    fn selected(&self, sel: &BTreeMap<String, String>) -> Vec<&Value> {
        self.workloads()
            .into_iter()
            .filter(|w| selects(sel, &labels(at(w, "/spec/template/metadata/labels"))))
            .collect()
    }
}

/// Every container of a workload's pod, init containers first.
fn containers(w: &Value) -> Vec<&Value> {
    arr(w, "/spec/template/spec/initContainers")
        .iter()
        .chain(arr(w, "/spec/template/spec/containers"))
        .collect()
}

/// The main container called `name`.
fn container<'a>(w: &'a Value, name: &str) -> &'a Value {
    arr(w, "/spec/template/spec/containers")
        .iter()
        .find(|c| st(c, "/name") == name)
        .unwrap_or_else(|| panic!("{}: no container {name}", st(w, "/metadata/name")))
}

/// A named container port's number.
fn container_port(c: &Value, name: &str) -> i64 {
    arr(c, "/ports")
        .iter()
        .find(|p| st(p, "/name") == name)
        .and_then(|p| at(p, "/containerPort").as_i64())
        .unwrap_or_else(|| panic!("container {}: no port {name}", st(c, "/name")))
}

/// An env var's source: ("secret", name, key), ("field", path, "") or ("value", v, "").
fn env_of(c: &Value, var: &str) -> Option<(String, String, String)> {
    let e = arr(c, "/env").iter().find(|e| st(e, "/name") == var)?;
    Some(if !at(e, "/valueFrom/secretKeyRef").is_null() {
        (
            "secret".into(),
            st(e, "/valueFrom/secretKeyRef/name").into(),
            st(e, "/valueFrom/secretKeyRef/key").into(),
        )
    } else if !at(e, "/valueFrom/fieldRef").is_null() {
        (
            "field".into(),
            st(e, "/valueFrom/fieldRef/fieldPath").into(),
            String::new(),
        )
    } else {
        ("value".into(), st(e, "/value").into(), String::new())
    })
}

/// The volume mounted at the directory holding `path` in container `c`, and the file's
/// name below it.
fn mount_for<'a>(w: &'a Value, c: &Value, path: &str) -> (&'a Value, String) {
    let (dir, file) = path.rsplit_once('/').expect("absolute path");
    let m = arr(c, "/volumeMounts")
        .iter()
        .find(|m| st(m, "/mountPath") == dir)
        .unwrap_or_else(|| panic!("{path}: nothing is mounted at {dir}"));
    let vol = arr(w, "/spec/template/spec/volumes")
        .iter()
        .find(|v| st(v, "/name") == st(m, "/name"))
        .unwrap_or_else(|| panic!("{path}: no volume {}", st(m, "/name")));
    (vol, file.to_string())
}

/// The Secrets the kustomization's comment tells the operator to create, with their keys.
fn declared_secrets(kustomization: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for l in kustomization.lines() {
        let Some(cmd) = l
            .trim_start_matches('#')
            .trim()
            .strip_prefix("kubectl create secret ")
        else {
            continue;
        };
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let (kind, name) = (words[0], words[1].to_string());
        let mut keys = BTreeSet::new();
        if kind == "tls" {
            keys.extend(["tls.crt".to_string(), "tls.key".to_string()]);
        }
        for w in &words[2..] {
            for flag in ["--from-literal=", "--from-file="] {
                if let Some(kv) = w.strip_prefix(flag) {
                    keys.insert(kv.split('=').next().unwrap_or("").to_string());
                }
            }
        }
        out.insert(name, keys);
    }
    out
}

/// The ConfigMaps the kustomization generates: name -> files.
fn generated_config_maps(k: &Value) -> BTreeMap<String, Vec<String>> {
    arr(k, "/configMapGenerator")
        .iter()
        .map(|g| {
            let files = arr(g, "/files")
                .iter()
                .map(|f| f.as_str().unwrap_or("").to_string())
                .collect();
            (st(g, "/name").to_string(), files)
        })
        .collect()
}

/// The init container that renders `config` into the main container's config path: checks
/// it reads the generated ConfigMap's file and fills each placeholder of the file from its
/// env; returns that env (placeholder -> source).
fn render_step(
    w: &Value,
    file: &str,
    maps: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, (String, String, String)> {
    let name = st(w, "/metadata/name");
    let main = container(w, "sandpit");
    let args: Vec<&str> = arr(main, "/args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let conf = args
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("{name}: no --config in {args:?}"));
    let inits = arr(w, "/spec/template/spec/initContainers");
    assert_eq!(
        inits.len(),
        1,
        "{name}: one init container renders the config"
    );
    let init = &inits[0];
    let script = arr(init, "/command")
        .last()
        .and_then(Value::as_str)
        .unwrap_or("");
    // Reads the template from the ConfigMap's mount, writes where the main container reads.
    let src = script
        .split_whitespace()
        .find(|w| w.ends_with(&format!("/{file}")) && !w.contains(conf))
        .unwrap_or_else(|| panic!("{name}: the init container reads no {file}: {script}"));
    let (vol, f) = mount_for(w, init, src);
    let cm = st(vol, "/configMap/name");
    assert!(
        maps.get(cm).is_some_and(|fs| fs.contains(&f)),
        "{name}: {src} is not a file of a generated ConfigMap ({cm})"
    );
    assert!(script.contains(&format!("> {conf}")), "{name}: {script}");
    let (out_vol, _) = mount_for(w, init, conf);
    let (main_vol, _) = mount_for(w, main, conf);
    assert_eq!(
        out_vol, main_vol,
        "{name}: init and main see other volumes at {conf}"
    );
    let mut env = BTreeMap::new();
    for p in placeholders(&read(file)) {
        assert!(
            script.contains(&format!("s|__{p}__|${{{p}}}|g")),
            "{name}: the init container does not fill __{p}__: {script}"
        );
        let src = env_of(init, &p).unwrap_or_else(|| panic!("{name}: no env {p} in the init"));
        env.insert(p, src);
    }
    env
}

/// The egress rules of the pods labelled `from` whose peers are the pods labelled `to`.
fn egress<'a>(
    cl: &'a Cluster,
    from: &BTreeMap<String, String>,
    to: &BTreeMap<String, String>,
) -> Vec<&'a Value> {
    cl.of_kind("NetworkPolicy")
        .into_iter()
        .filter(|np| selects(&labels(at(np, "/spec/podSelector/matchLabels")), from))
        .flat_map(|np| arr(np, "/spec/egress"))
        .filter(|r| {
            arr(r, "/to")
                .iter()
                .any(|p| labels(at(p, "/podSelector/matchLabels")) == *to)
        })
        .collect()
}

#[test]
fn manifests_refer_to_each_other_and_to_the_configs_consistently() {
    let Some(yaml) = load_yaml() else { return };
    let kustomization = &yaml["kustomization.yaml"][0];
    let docs: Vec<Value> = manifest_files()
        .iter()
        .flat_map(|f| yaml[f].iter().cloned())
        .collect();
    let cl = Cluster { docs };

    // The kustomization applies every manifest and generates a ConfigMap of every config.
    let resources: BTreeSet<String> = arr(kustomization, "/resources")
        .iter()
        .map(|r| r.as_str().unwrap_or("").to_string())
        .collect();
    let manifests: BTreeSet<String> = manifest_files().into_iter().collect();
    assert_eq!(resources, manifests, "kustomization resources");
    let maps = generated_config_maps(kustomization);
    let generated: Vec<String> = maps.values().flatten().cloned().collect();
    assert_eq!(generated, files("toml"), "configMapGenerator files");
    let secrets = declared_secrets(&read("kustomization.yaml"));
    assert!(secrets.len() >= 5, "{secrets:?}");

    // Every object is sandpit's (the default-deny policy selects by that label).
    for d in &cl.docs {
        assert_eq!(
            st(d, "/metadata/labels/app.kubernetes.io~1name"),
            "sandpit",
            "{} {}",
            st(d, "/kind"),
            st(d, "/metadata/name")
        );
    }

    // Workloads: selectors select their own pods; volumes, ConfigMaps and Secrets exist;
    // every container is locked down and sized.
    let mut used_secrets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for w in cl.workloads() {
        let name = st(w, "/metadata/name");
        let pod = labels(at(w, "/spec/template/metadata/labels"));
        let sel = labels(at(w, "/spec/selector/matchLabels"));
        assert!(!sel.is_empty() && selects(&sel, &pod), "{name}: selector");
        let spec = at(w, "/spec/template/spec");
        assert_eq!(
            at(spec, "/securityContext/runAsNonRoot"),
            &Value::Bool(true),
            "{name}"
        );
        assert_eq!(
            at(spec, "/automountServiceAccountToken"),
            &Value::Bool(false),
            "{name}"
        );
        let mut volumes: BTreeSet<&str> = arr(spec, "/volumes")
            .iter()
            .map(|v| st(v, "/name"))
            .collect();
        let claims: BTreeSet<&str> = arr(w, "/spec/volumeClaimTemplates")
            .iter()
            .map(|v| st(v, "/metadata/name"))
            .collect();
        for v in arr(spec, "/volumes") {
            if let Some(cm) = at(v, "/configMap/name").as_str() {
                assert!(
                    maps.contains_key(cm),
                    "{name}: ConfigMap {cm} is not generated"
                );
            }
            if let Some(s) = at(v, "/secret/secretName").as_str() {
                let keys = secrets
                    .get(s)
                    .unwrap_or_else(|| panic!("{name}: Secret {s} is not declared"));
                for item in arr(v, "/secret/items") {
                    let k = st(item, "/key");
                    assert!(keys.contains(k), "{name}: Secret {s} has no key {k}");
                    used_secrets.entry(s.into()).or_default().insert(k.into());
                }
            }
        }
        let mut mounted = BTreeSet::new();
        for c in containers(w) {
            let cname = st(c, "/name");
            let sc = at(c, "/securityContext");
            assert_eq!(
                at(sc, "/readOnlyRootFilesystem"),
                &Value::Bool(true),
                "{name}/{cname}"
            );
            assert_eq!(
                at(sc, "/allowPrivilegeEscalation"),
                &Value::Bool(false),
                "{name}/{cname}"
            );
            assert_eq!(
                at(sc, "/capabilities/drop"),
                &serde_json::json!(["ALL"]),
                "{name}/{cname}"
            );
            for r in [
                "/resources/requests/cpu",
                "/resources/requests/memory",
                "/resources/limits/memory",
            ] {
                assert!(!at(c, r).is_null(), "{name}/{cname}: no {r}");
            }
            for m in arr(c, "/volumeMounts") {
                let v = st(m, "/name");
                assert!(
                    volumes.contains(v) || claims.contains(v),
                    "{name}/{cname}: no volume {v}"
                );
                mounted.insert(v.to_string());
            }
            for e in arr(c, "/env") {
                if let Some((_, s, k)) = env_of(c, st(e, "/name")).filter(|e| e.0 == "secret") {
                    assert!(
                        secrets.get(&s).is_some_and(|ks| ks.contains(&k)),
                        "{name}/{cname}: Secret {s} key {k} is not declared"
                    );
                    used_secrets.entry(s).or_default().insert(k);
                }
            }
        }
        volumes.extend(claims);
        let unmounted: Vec<_> = volumes.iter().filter(|v| !mounted.contains(**v)).collect();
        assert!(
            unmounted.is_empty(),
            "{name}: volumes never mounted: {unmounted:?}"
        );
        // The sandpit image's user (docker/Dockerfile: useradd --uid 10001).
        if containers(w)
            .iter()
            .any(|c| st(c, "/image").starts_with("sandpit"))
        {
            assert_eq!(
                at(spec, "/securityContext/runAsUser"),
                &Value::from(10001),
                "{name}"
            );
        }
    }
    assert_eq!(used_secrets, secrets, "declared Secrets vs the ones used");

    // Services select a workload, and their target ports are its container ports.
    for s in cl.of_kind("Service") {
        let name = st(s, "/metadata/name");
        let sel = labels(at(s, "/spec/selector"));
        let ws = cl.selected(&sel);
        assert!(
            !sel.is_empty() && ws.len() == 1,
            "Service {name} selects {}",
            ws.len()
        );
        for p in arr(s, "/spec/ports") {
            let target = st(p, "/targetPort");
            let c = &arr(ws[0], "/spec/template/spec/containers")[0];
            assert_eq!(
                container_port(c, target),
                at(p, "/port").as_i64().expect("port"),
                "Service {name}: port {target}"
            );
        }
    }

    // NetworkPolicies select workloads, and so do their same-namespace peers.
    for np in cl.of_kind("NetworkPolicy") {
        let name = st(np, "/metadata/name");
        let sel = labels(at(np, "/spec/podSelector/matchLabels"));
        assert!(
            !sel.is_empty(),
            "{name}: selects every pod of the namespace"
        );
        assert!(!cl.selected(&sel).is_empty(), "{name}: selects no workload");
        for rule in arr(np, "/spec/ingress")
            .iter()
            .chain(arr(np, "/spec/egress"))
        {
            for peer in arr(rule, "/from").iter().chain(arr(rule, "/to")) {
                if at(peer, "/namespaceSelector").is_null() {
                    let ps = labels(at(peer, "/podSelector/matchLabels"));
                    assert!(
                        !cl.selected(&ps).is_empty(),
                        "{name}: a peer selects nothing"
                    );
                }
            }
        }
    }
    let deny = cl.named("NetworkPolicy", "sandpit-default-deny");
    assert_eq!(
        at(deny, "/spec/policyTypes"),
        &serde_json::json!(["Ingress", "Egress"])
    );
    assert!(at(deny, "/spec/ingress").is_null() && at(deny, "/spec/egress").is_null());
    assert_eq!(
        cl.selected(&labels(at(deny, "/spec/podSelector/matchLabels")))
            .len(),
        cl.workloads().len()
    );

    // --- The fronts ---
    let front = cl.named("Deployment", "sandpit-front");
    let front_env = render_step(front, "front.toml", &maps);
    let fc = container(front, "sandpit");
    let fcfg = load_config(
        &render(&read("front.toml"), &test_values("unused")),
        "front.toml",
    );
    let front_labels = labels(at(front, "/spec/template/metadata/labels"));
    // Agents: the Postgres port, open to all; nothing else is.
    let pg = container_port(fc, "postgres");
    assert_eq!(pg, port_of(fcfg.listen));
    let svc = cl.named("Service", "sandpit");
    assert_eq!(at(svc, "/spec/ports/0/port").as_i64(), Some(pg));
    assert_eq!(
        arr(svc, "/spec/ports").len(),
        1,
        "the agents' Service has one port"
    );
    assert_eq!(fcfg.dsn_host(), "sandpit", "DSNs name the agents' Service");
    // The harness: the API port, from labelled pods only.
    let api = container_port(fc, "api");
    assert_eq!(api, port_of(fcfg.api_listen));
    let api_svc = cl.named("Service", "sandpit-api");
    assert_eq!(at(api_svc, "/spec/ports/0/port").as_i64(), Some(api));
    let ingress_to_front: Vec<(&Value, i64)> = cl
        .of_kind("NetworkPolicy")
        .into_iter()
        .filter(|np| {
            selects(
                &labels(at(np, "/spec/podSelector/matchLabels")),
                &front_labels,
            )
        })
        .flat_map(|np| arr(np, "/spec/ingress"))
        .flat_map(|r| {
            arr(r, "/ports")
                .iter()
                .map(move |p| (r, at(p, "/port").as_i64().unwrap_or(0)))
        })
        .collect();
    let open: BTreeSet<i64> = ingress_to_front.iter().map(|(_, p)| *p).collect();
    assert_eq!(open, BTreeSet::from([pg, api]), "ports open on the fronts");
    for (rule, port) in &ingress_to_front {
        let from = arr(rule, "/from");
        if *port == pg {
            assert!(
                from.is_empty(),
                "agents reach the Postgres port from anywhere"
            );
        } else {
            assert!(
                !from.is_empty()
                    && from
                        .iter()
                        .all(|p| !labels(at(p, "/podSelector/matchLabels")).is_empty()),
                "the API port is open to unlabelled pods"
            );
        }
    }
    // Probes ask the route the API serves, on the API port.
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(
            st(fc, &format!("/{probe}/httpGet/path")),
            "/healthz",
            "{probe}"
        );
        assert_eq!(st(fc, &format!("/{probe}/httpGet/port")), "api", "{probe}");
    }
    let control =
        std::fs::read_to_string(Path::new(ROOT).join("src/control/mod.rs")).expect("read");
    assert!(control.contains("\"/healthz\""));
    // The keys: the admin key, and the workers' bearer key from the Secret the workers use.
    assert_eq!(
        env_of(fc, "SANDPIT_ADMIN_KEY").map(|e| e.0),
        Some("secret".into())
    );
    let remote_key = env_of(fc, "SANDPIT_REMOTE_API_KEY").expect("fronts hold the worker key");
    // Files the config names are in mounted Secrets.
    for p in [
        fcfg.tls.cert.clone(),
        fcfg.tls.key.clone(),
        fcfg.remote.ca_file.clone(),
    ] {
        let p = p.expect("front TLS files");
        let p = p.to_str().expect("utf-8");
        let (vol, f) = mount_for(front, fc, p);
        assert!(
            arr(vol, "/secret/items")
                .iter()
                .any(|i| st(i, "/path") == f),
            "front: {p} is not an item of a Secret volume"
        );
    }
    // The HPA scales the fronts on a gauge sandpit records.
    let hpa = cl.named("HorizontalPodAutoscaler", "sandpit-front");
    assert_eq!(st(hpa, "/spec/scaleTargetRef/kind"), "Deployment");
    assert_eq!(st(hpa, "/spec/scaleTargetRef/name"), "sandpit-front");
    let metric = st(hpa, "/spec/metrics/0/pods/metric/name");
    assert!(
        sandpit::control::METRICS
            .iter()
            .any(|(n, k, _, _)| *n == metric && *k == sandpit::control::MetricKind::Gauge),
        "the HPA's metric {metric} is not a gauge sandpit records"
    );
    assert_eq!(
        st(hpa, "/spec/behavior/scaleDown/selectPolicy"),
        "Disabled",
        "fronts hold logs"
    );

    // --- The workers ---
    let worker = cl.named("StatefulSet", "sandpit-worker");
    let worker_env = render_step(worker, "worker.toml", &maps);
    assert_eq!(
        worker_env.get("POD_NAME"),
        Some(&("field".into(), "metadata.name".into(), String::new()))
    );
    let wc = container(worker, "sandpit");
    let replicas = at(worker, "/spec/replicas").as_i64().expect("replicas");
    let service = st(worker, "/spec/serviceName");
    let headless = cl.named("Service", service);
    assert_eq!(
        st(headless, "/spec/clusterIP"),
        "None",
        "{service} is not headless"
    );
    let wport = container_port(wc, "worker-api");
    assert_eq!(at(headless, "/spec/ports/0/port").as_i64(), Some(wport));
    assert_eq!(
        env_of(wc, "SANDPIT_WORKER_API_KEY"),
        Some(remote_key),
        "fronts and workers hold the same bearer key"
    );
    // remote.urls: exactly the StatefulSet's pods, in ordinal order, at the worker's port;
    // each pod's worker.host (where its doors are) is the host of its URL.
    let sts = st(worker, "/metadata/name");
    let want: Vec<String> = (0..replicas)
        .map(|i| format!("https://{sts}-{i}.{service}:{wport}/"))
        .collect();
    assert_eq!(fcfg.remote.urls, want, "front.toml remote.urls");
    for i in 0..replicas {
        let pod = format!("{sts}-{i}");
        let wcfg = load_config(
            &render(&read("worker.toml"), &test_values(&pod)),
            "worker.toml",
        );
        assert_eq!(wcfg.worker.listen.map(port_of), Some(wport));
        assert_eq!(wcfg.worker.host, Some(format!("{pod}.{service}")));
        assert_eq!(wcfg.worker.golden, fcfg.remote.golden, "golden name");
        assert_eq!(fcfg.remote.sslmode, "verify-full");
        assert!(wcfg.tls.mode == "files");
        for p in [wcfg.tls.cert.clone(), wcfg.tls.key.clone()] {
            let p = p.expect("worker TLS files");
            let (vol, f) = mount_for(worker, wc, p.to_str().expect("utf-8"));
            assert!(arr(vol, "/secret/items")
                .iter()
                .any(|i| st(i, "/path") == f));
            // The fronts' CA comes from the same Secret as the workers' certificate.
            let ca = fcfg.remote.ca_file.clone().expect("ca_file");
            let (ca_vol, _) = mount_for(front, fc, ca.to_str().expect("utf-8"));
            assert_eq!(
                st(ca_vol, "/secret/secretName"),
                st(vol, "/secret/secretName")
            );
        }
        // The data dir is on the volume claim.
        let data = wcfg.data_dir.to_str().expect("utf-8").to_string();
        let on_claim = arr(wc, "/volumeMounts").iter().any(|m| {
            data.starts_with(&format!("{}/", st(m, "/mountPath")))
                && arr(worker, "/spec/volumeClaimTemplates")
                    .iter()
                    .any(|c| st(c, "/metadata/name") == st(m, "/name"))
        });
        assert!(on_claim, "worker data_dir {data} is not on a volume claim");
    }
    // Doors: the kernel's ephemeral range, pinned by sysctl, is exactly what the policies open
    // from fronts to workers (and the API port), and only fronts get in.
    let range = arr(worker, "/spec/template/spec/securityContext/sysctls")
        .iter()
        .find(|s| st(s, "/name") == "net.ipv4.ip_local_port_range")
        .map(|s| {
            st(s, "/value")
                .split_whitespace()
                .map(|n| n.parse::<i64>().expect("port"))
                .collect::<Vec<_>>()
        })
        .expect("the door range is pinned");
    let worker_labels = labels(at(worker, "/spec/template/metadata/labels"));
    let wanted_ports = serde_json::json!([
        {"protocol": "TCP", "port": wport},
        {"protocol": "TCP", "port": range[0], "endPort": range[1]},
    ]);
    let mut ingress_rules = 0;
    for np in cl.of_kind("NetworkPolicy") {
        if selects(
            &labels(at(np, "/spec/podSelector/matchLabels")),
            &worker_labels,
        ) {
            for r in arr(np, "/spec/ingress") {
                ingress_rules += 1;
                assert_eq!(
                    at(r, "/ports"),
                    &wanted_ports,
                    "{}",
                    st(np, "/metadata/name")
                );
                let from = arr(r, "/from");
                assert!(!from.is_empty());
                for p in from {
                    assert!(at(p, "/namespaceSelector").is_null());
                    assert_eq!(
                        labels(at(p, "/podSelector/matchLabels")),
                        front_labels,
                        "workers: fronts only"
                    );
                }
            }
        }
    }
    assert_eq!(ingress_rules, 1, "one ingress rule for the workers");
    let to_workers = egress(&cl, &front_labels, &worker_labels);
    assert_eq!(to_workers.len(), 1);
    assert_eq!(
        at(to_workers[0], "/ports"),
        &wanted_ports,
        "front egress to workers"
    );

    // --- The registry ---
    let registry = cl.named("StatefulSet", "sandpit-registry");
    let rc = &arr(registry, "/spec/template/spec/containers")[0];
    let url: tokio_postgres::Config = fcfg
        .registry
        .url
        .as_deref()
        .expect("registry.url")
        .parse()
        .expect("the rendered registry.url parses");
    let host = match url.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        other => panic!("registry host {other:?}"),
    };
    let rsvc = cl.named("Service", &host);
    let rport = i64::from(url.get_ports().first().copied().unwrap_or(5432));
    assert_eq!(at(rsvc, "/spec/ports/0/port").as_i64(), Some(rport));
    assert!(
        cl.selected(&labels(at(rsvc, "/spec/selector")))
            .contains(&registry),
        "the registry URL's Service selects the registry"
    );
    assert_eq!(container_port(rc, "postgres"), rport);
    assert_eq!(
        env_of(rc, "POSTGRES_USER").map(|e| e.1).as_deref(),
        url.get_user()
    );
    assert_eq!(
        env_of(rc, "POSTGRES_DB").map(|e| e.1).as_deref(),
        url.get_dbname()
    );
    assert_eq!(
        env_of(rc, "POSTGRES_PASSWORD"),
        front_env.get("REGISTRY_PASSWORD").cloned(),
        "the fronts' registry password is the registry's"
    );
    let registry_labels = labels(at(registry, "/spec/template/metadata/labels"));
    let to_registry = egress(&cl, &front_labels, &registry_labels);
    assert_eq!(to_registry.len(), 1);
    assert_eq!(at(to_registry[0], "/ports/0/port").as_i64(), Some(rport));
    for np in cl.of_kind("NetworkPolicy") {
        if selects(
            &labels(at(np, "/spec/podSelector/matchLabels")),
            &registry_labels,
        ) {
            for r in arr(np, "/spec/ingress") {
                for p in arr(r, "/from") {
                    assert_eq!(
                        labels(at(p, "/podSelector/matchLabels")),
                        front_labels,
                        "registry: fronts only"
                    );
                }
                assert_eq!(at(r, "/ports/0/port").as_i64(), Some(rport));
            }
            // Workers and the registry open no connection of their own.
            assert!(arr(np, "/spec/egress").is_empty());
        }
        if selects(
            &labels(at(np, "/spec/podSelector/matchLabels")),
            &worker_labels,
        ) {
            assert!(arr(np, "/spec/egress").is_empty());
        }
    }
}
