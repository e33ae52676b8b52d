//! The manifests as the cross-reference checks read them: JSON pointers, labels and
//! selectors, workloads' containers, env sources, mounts, declared Secrets, generated
//! ConfigMaps, the init containers' render step and egress rules.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::configs::placeholders;
use super::read;

pub(super) fn at<'a>(v: &'a Value, ptr: &str) -> &'a Value {
    v.pointer(ptr).unwrap_or(&Value::Null)
}

pub(super) fn st<'a>(v: &'a Value, ptr: &str) -> &'a str {
    at(v, ptr).as_str().unwrap_or("")
}

pub(super) fn arr<'a>(v: &'a Value, ptr: &str) -> &'a [Value] {
    at(v, ptr).as_array().map(Vec::as_slice).unwrap_or(&[])
}

pub(super) fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// `sel` selects `pod` (every key of the selector has the pod's value).
pub(super) fn selects(sel: &BTreeMap<String, String>, pod: &BTreeMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| pod.get(k) == Some(v))
}

pub(super) fn port_of(addr: std::net::SocketAddr) -> i64 {
    i64::from(addr.port())
}

/// The manifests as the checks read them.
pub(super) struct Cluster {
    pub(super) docs: Vec<Value>,
}

impl Cluster {
    pub(super) fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| st(d, "/kind") == kind)
            .collect()
    }

    pub(super) fn named(&self, kind: &str, name: &str) -> &Value {
        self.of_kind(kind)
            .into_iter()
            .find(|d| st(d, "/metadata/name") == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    pub(super) fn workloads(&self) -> Vec<&Value> {
        self.docs
            .iter()
            .filter(|d| matches!(st(d, "/kind"), "Deployment" | "StatefulSet"))
            .collect()
    }

    /// The workloads whose pods `sel` selects.
    pub(super) fn selected(&self, sel: &BTreeMap<String, String>) -> Vec<&Value> {
        self.workloads()
            .into_iter()
            .filter(|w| selects(sel, &labels(at(w, "/spec/template/metadata/labels"))))
            .collect()
    }
}

/// Every container of a workload's pod, init containers first.
pub(super) fn containers(w: &Value) -> Vec<&Value> {
    arr(w, "/spec/template/spec/initContainers")
        .iter()
        .chain(arr(w, "/spec/template/spec/containers"))
        .collect()
}

/// The main container called `name`.
pub(super) fn container<'a>(w: &'a Value, name: &str) -> &'a Value {
    arr(w, "/spec/template/spec/containers")
        .iter()
        .find(|c| st(c, "/name") == name)
        .unwrap_or_else(|| panic!("{}: no container {name}", st(w, "/metadata/name")))
}

/// A named container port's number.
pub(super) fn container_port(c: &Value, name: &str) -> i64 {
    arr(c, "/ports")
        .iter()
        .find(|p| st(p, "/name") == name)
        .and_then(|p| at(p, "/containerPort").as_i64())
        .unwrap_or_else(|| panic!("container {}: no port {name}", st(c, "/name")))
}

/// An env var's source: ("secret", name, key), ("field", path, "") or ("value", v, "").
pub(super) fn env_of(c: &Value, var: &str) -> Option<(String, String, String)> {
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
pub(super) fn mount_for<'a>(w: &'a Value, c: &Value, path: &str) -> (&'a Value, String) {
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
pub(super) fn declared_secrets(kustomization: &str) -> BTreeMap<String, BTreeSet<String>> {
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
pub(super) fn generated_config_maps(k: &Value) -> BTreeMap<String, Vec<String>> {
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
pub(super) fn render_step(
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
pub(super) fn egress<'a>(
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
