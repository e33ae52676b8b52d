//! The container files under docker/ cannot be built here (no Docker engine on the test
//! machines), so this checks what can be checked without one: every config file they use
//! loads and validates as `sandpit serve` would load it, every path they reference exists
//! in the repository, and every flag they pass is one the binary accepts.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sandpit"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run sandpit --help");
    assert!(out.status.success(), "{args:?} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Long flags (`--x`) in a command line.
fn flags(words: &[String]) -> Vec<String> {
    words
        .iter()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.split('=').next().unwrap_or(w).to_string())
        .collect()
}

fn assert_flags_accepted(sub: &[&str], words: &[String], origin: &str) {
    let h = help(sub);
    for f in flags(words) {
        assert!(
            h.contains(&format!("{f} ")),
            "{origin}: `sandpit {}` has no flag {f}",
            sub.join(" ")
        );
    }
}

/// JSON-array command lines (`CMD [...]`, `command: [...]`, `args: [...]`).
fn array_commands(text: &str, keys: &[&str]) -> Vec<Vec<String>> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim().trim_start_matches("- ");
            let rest = keys.iter().find_map(|k| l.strip_prefix(k))?;
            let rest = rest.trim();
            rest.starts_with('[')
                .then(|| serde_json::from_str::<Vec<String>>(rest).ok())
                .flatten()
        })
        .collect()
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn every_config_file_under_docker_loads_and_validates() {
    let mut files = Vec::new();
    all_files(&Path::new(ROOT).join("docker"), &mut files);
    let tomls: Vec<_> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    assert!(tomls.len() >= 2, "{tomls:?}");
    for p in tomls {
        let cfg = sandpit::config::Config::load(Some(p))
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        cfg.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}

#[test]
fn dockerfile_paths_and_flags() {
    let df = read("docker/Dockerfile");
    // Build context is the repository root (compose says so too, checked below).
    for line in df.lines().filter(|l| l.starts_with("COPY ")) {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        if words.iter().any(|w| w.starts_with("--from")) {
            continue;
        }
        for src in &words[..words.len() - 1] {
            assert!(
                Path::new(ROOT).join(src).exists(),
                "Dockerfile copies {src}, which is not in the repository"
            );
        }
    }
    assert!(df.contains("COPY docker/sandpit.toml /etc/sandpit/sandpit.toml"));
    let cmds = array_commands(&df, &["CMD", "ENTRYPOINT"]);
    assert!(cmds.contains(&vec!["sandpit".to_string()]), "{cmds:?}");
    let serve: Vec<_> = cmds
        .iter()
        .filter(|c| c.first().map(String::as_str) == Some("serve"))
        .collect();
    assert_eq!(serve.len(), 1, "{cmds:?}");
    assert_flags_accepted(&["serve"], serve[0], "Dockerfile CMD");
    assert!(serve[0].contains(&"/etc/sandpit/sandpit.toml".to_string()));
    // The health check asks a route the API has.
    assert!(df.contains("http://127.0.0.1:6433/healthz"));
    assert!(read("src/control/mod.rs").contains("\"/healthz\""));
    // The packaged example script is there too.
    assert!(Path::new(ROOT).join("docker/harness-example.sh").exists());
}

#[test]
fn compose_paths_and_flags() {
    let c = read("docker/compose.yaml");
    let dir = Path::new(ROOT).join("docker");
    assert!(c.contains("context: ..") && c.contains("dockerfile: docker/Dockerfile"));
    assert!(dir.join("..").join("docker/Dockerfile").exists());
    // Bind mounts: "- ./x:/y[:ro]" relative to docker/.
    let mut mounts = 0;
    for l in c.lines().map(str::trim) {
        if let Some(m) = l.strip_prefix("- ./") {
            let src = m.split(':').next().unwrap_or("");
            assert!(
                dir.join(src).exists(),
                "compose mounts ./{src}, which does not exist"
            );
            mounts += 1;
        }
    }
    assert_eq!(mounts, 2);
    assert!(c.contains("./sandpit.toml:/etc/sandpit/sandpit.toml:ro"));
    assert!(c.contains("./harness-example.sh:/harness/harness-example.sh:ro"));
    let cmds = array_commands(&c, &["command:", "entrypoint:"]);
    let serve: Vec<_> = cmds
        .iter()
        .filter(|c| c.first().map(String::as_str) == Some("serve"))
        .collect();
    assert_eq!(serve.len(), 1, "{cmds:?}");
    assert_flags_accepted(&["serve"], serve[0], "compose command");
    assert!(cmds.contains(&vec!["bash".into(), "/harness/harness-example.sh".into()]));
}

#[test]
fn kubernetes_paths_and_flags() {
    let dir = Path::new(ROOT).join("docker/kubernetes");
    let k = read("docker/kubernetes/kustomization.yaml");
    for l in k.lines().map(str::trim) {
        // List items that are file names (resources, configMapGenerator files).
        if let Some(f) = l.strip_prefix("- ").filter(|f| !f.contains(':')) {
            assert!(
                dir.join(f).exists(),
                "kustomization names {f}, which does not exist"
            );
        }
    }
    assert!(k.contains("name: sandpit-config") && k.contains("- sandpit.toml"));
    let s = read("docker/kubernetes/sidecar.yaml");
    let cmds = array_commands(&s, &["args:", "command:"]);
    assert_eq!(cmds.len(), 1, "{cmds:?}");
    assert_eq!(cmds[0][0], "serve");
    assert_flags_accepted(&["serve"], &cmds[0], "sidecar args");
    // The config the args name is where the ConfigMap (key sandpit.toml) is mounted.
    assert!(cmds[0].contains(&"/etc/sandpit/sandpit.toml".to_string()));
    assert!(s.contains("mountPath: /etc/sandpit") && s.contains("name: sandpit-config"));
    // Admin key from the Secret the kustomization comment tells you to create; metrics
    // scraped on the port and path the API serves.
    assert!(s.contains("name: sandpit-admin") && s.contains("key: admin-key"));
    assert!(k.contains("create secret generic sandpit-admin --from-literal=admin-key="));
    assert!(
        s.contains("prometheus.io/path: /metrics") && s.contains("prometheus.io/port: \"6433\"")
    );
    assert!(read("src/control/mod.rs").contains("\"/metrics\""));
    let cfg = sandpit::config::Config::load(Some(&dir.join("sandpit.toml"))).expect("load");
    assert_eq!(cfg.api_listen.port(), 6433);
    assert_eq!(cfg.listen.port(), 6432);
}

#[test]
fn harness_example_uses_real_subcommands_and_flags() {
    let script = read("docker/harness-example.sh");
    let mut seen = 0;
    for l in script.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let Some(at) = l.find("sandpit ") else {
            continue;
        };
        let words: Vec<String> = l[at..]
            .split(|c: char| c.is_whitespace() || c == ')' || c == '"')
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect();
        let sub: Vec<&str> = match words.get(1).map(String::as_str) {
            Some("token") => vec!["token", words.get(2).map(String::as_str).unwrap_or("")],
            Some(s) => vec![s],
            None => continue,
        };
        assert_flags_accepted(&sub, &words, "harness-example.sh");
        seen += 1;
    }
    assert!(seen >= 4, "{seen}");
}
