//! What a schema cannot see: the manifests refer to each other and to the configs
//! consistently (selectors that select, Secrets and ConfigMaps that exist, ports that agree,
//! network policies that let agents reach only the fronts' Postgres port and only fronts reach
//! the workers and the registry). One test per part of the cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use super::configs::{load_config, render, test_values};
use super::model::{
    arr, at, container, container_port, containers, declared_secrets, egress, env_of,
    generated_config_maps, labels, mount_for, port_of, render_step, selects, st, Cluster,
};
use super::{files, load_yaml, manifest_files, read, ROOT};

/// The manifests, the ConfigMaps the kustomization generates and the Secrets it declares.
struct Manifests {
    kustomization: Value,
    cl: Cluster,
    maps: BTreeMap<String, Vec<String>>,
    secrets: BTreeMap<String, BTreeSet<String>>,
}

/// None (after saying why) when PyYAML is missing outside CI.
fn manifests() -> Option<Manifests> {
    let yaml = load_yaml()?;
    let kustomization = yaml["kustomization.yaml"][0].clone();
    let docs: Vec<Value> = manifest_files()
        .iter()
        .flat_map(|f| yaml[f].iter().cloned())
        .collect();
    let maps = generated_config_maps(&kustomization);
    Some(Manifests {
        kustomization,
        cl: Cluster { docs },
        maps,
        secrets: declared_secrets(&read("kustomization.yaml")),
    })
}

/// The fronts' Deployment, its sandpit container, pod labels, rendered config and the env
/// its init container renders the config from.
struct Front<'a> {
    front: &'a Value,
    fc: &'a Value,
    front_labels: BTreeMap<String, String>,
    fcfg: sandpit::config::Config,
    front_env: BTreeMap<String, (String, String, String)>,
}

impl<'a> Front<'a> {
    fn new(m: &'a Manifests) -> Front<'a> {
        let front = m.cl.named("Deployment", "sandpit-front");
        Front {
            front,
            fc: container(front, "sandpit"),
            front_labels: labels(at(front, "/spec/template/metadata/labels")),
            fcfg: load_config(
                &render(&read("front.toml"), &test_values("unused")),
                "front.toml",
            ),
            front_env: render_step(front, "front.toml", &m.maps),
        }
    }
}

#[test]
fn the_kustomization_applies_every_manifest_and_every_object_is_sandpits() {
    let Some(m) = manifests() else { return };
    let (kustomization, cl) = (&m.kustomization, &m.cl);
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
}

#[test]
fn workloads_select_their_pods_mount_what_exists_and_are_locked_down() {
    let Some(m) = manifests() else { return };
    let (cl, maps, secrets) = (&m.cl, &m.maps, &m.secrets);
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
    assert_eq!(&used_secrets, secrets, "declared Secrets vs the ones used");
}

#[test]
fn services_and_network_policies_select_workloads_and_the_default_denies_all() {
    let Some(m) = manifests() else { return };
    let cl = &m.cl;
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
}

#[test]
fn fronts_open_postgres_to_agents_and_the_api_to_labelled_pods_and_scale_on_a_gauge() {
    let Some(m) = manifests() else { return };
    let cl = &m.cl;
    let Front {
        front,
        fc,
        front_labels,
        fcfg,
        ..
    } = Front::new(&m);
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
    assert!(
        env_of(fc, "SANDPIT_REMOTE_API_KEY").is_some(),
        "fronts hold the worker key"
    );
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
    // Fronts hold nothing another front needs, so the HPA may scale them down: their logs,
    // reviews and decisions are on the shared volume every front mounts at shared_dir.
    assert_ne!(
        st(hpa, "/spec/behavior/scaleDown/selectPolicy"),
        "Disabled",
        "fronts are stateless: scale-down is allowed"
    );
    let shared_dir = fcfg
        .registry
        .shared_dir
        .clone()
        .expect("registry.shared_dir");
    let shared_dir = shared_dir.to_str().expect("utf-8");
    let mount = arr(fc, "/volumeMounts")
        .iter()
        .find(|m| st(m, "/mountPath") == shared_dir)
        .expect("the front mounts its shared_dir");
    let vol = arr(front, "/spec/template/spec/volumes")
        .iter()
        .find(|v| st(v, "/name") == st(mount, "/name"))
        .expect("the shared_dir's volume");
    let claim = cl.named(
        "PersistentVolumeClaim",
        st(vol, "/persistentVolumeClaim/claimName"),
    );
    assert_eq!(
        at(claim, "/spec/accessModes"),
        &serde_json::json!(["ReadWriteMany"]),
        "every front mounts the same volume"
    );
}

#[test]
fn workers_are_the_fronts_urls_and_are_reached_by_fronts_only() {
    let Some(m) = manifests() else { return };
    let (cl, maps) = (&m.cl, &m.maps);
    let Front {
        front,
        fc,
        front_labels,
        fcfg,
        ..
    } = Front::new(&m);
    let remote_key = env_of(fc, "SANDPIT_REMOTE_API_KEY").expect("fronts hold the worker key");
    let worker = cl.named("StatefulSet", "sandpit-worker");
    let worker_env = render_step(worker, "worker.toml", maps);
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
    let to_workers = egress(cl, &front_labels, &worker_labels);
    assert_eq!(to_workers.len(), 1);
    assert_eq!(
        at(to_workers[0], "/ports"),
        &wanted_ports,
        "front egress to workers"
    );
}

#[test]
fn the_registry_is_the_fronts_url_and_is_reached_by_fronts_only() {
    let Some(m) = manifests() else { return };
    let cl = &m.cl;
    let Front {
        front_labels,
        fcfg,
        front_env,
        ..
    } = Front::new(&m);
    let worker = cl.named("StatefulSet", "sandpit-worker");
    let worker_labels = labels(at(worker, "/spec/template/metadata/labels"));
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
    let to_registry = egress(cl, &front_labels, &registry_labels);
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
