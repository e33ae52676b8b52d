//! The container files under docker/: every config file they use loads and validates as
//! `sandpit serve` would load it, every path they reference exists, every flag they pass is
//! one the binary accepts, the Dockerfile's build stage compiles from exactly what it copies,
//! and, where a container engine and the base images are on the machine, the image builds and
//! runs the quick start.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::require;

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

/// The build stage of docker/Dockerfile: its COPY lines as (sources, destination) and the
/// `cargo build …` words of its RUN line.
struct BuildStage {
    copies: Vec<(Vec<String>, String)>,
    cargo: Vec<String>,
}

fn build_stage(df: &str) -> BuildStage {
    let mut stage = None;
    let mut copies = Vec::new();
    let mut cargo = Vec::new();
    for l in df.lines().map(str::trim) {
        if let Some(from) = l.strip_prefix("FROM ") {
            stage = from.split_whitespace().last().map(str::to_string);
            continue;
        }
        if stage.as_deref() != Some("build") {
            continue;
        }
        if let Some(c) = l.strip_prefix("COPY ") {
            let words: Vec<String> = c.split_whitespace().map(str::to_string).collect();
            assert!(
                !words.iter().any(|w| w.starts_with("--")),
                "build stage COPY with flags is not understood here: {l}"
            );
            let (dest, srcs) = words.split_last().expect("COPY has words");
            copies.push((srcs.to_vec(), dest.clone()));
        } else if let Some(r) = l.strip_prefix("RUN ") {
            if r.starts_with("cargo build") {
                cargo = r.split_whitespace().skip(2).map(str::to_string).collect();
            }
        }
    }
    assert!(!copies.is_empty(), "no COPY in the build stage");
    assert!(cargo.contains(&"--locked".to_string()), "{cargo:?}");
    BuildStage { copies, cargo }
}

/// `.dockerignore` patterns: `name` or `dir/name` (that path and below, from the root) and
/// `**/name` (a path component anywhere). Other forms fail the test rather than being guessed.
fn ignore_patterns() -> Vec<String> {
    // Missing: nothing is excluded (the test of the file itself is separate).
    let text = std::fs::read_to_string(Path::new(ROOT).join(".dockerignore")).unwrap_or_default();
    let pats: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_start_matches('/').trim_end_matches('/').to_string())
        .collect();
    for p in &pats {
        let body = p.strip_prefix("**/").unwrap_or(p);
        assert!(
            !p.starts_with('!') && !body.contains('*') && !body.contains('?'),
            ".dockerignore pattern {p} is not one this test understands"
        );
    }
    pats
}

fn ignored(rel: &Path, pats: &[String]) -> bool {
    let comps: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    pats.iter().any(|p| match p.strip_prefix("**/") {
        Some(name) => comps.iter().any(|c| c == name),
        None => rel.starts_with(p),
    })
}

/// Copies `rel` (a file or a tree) from the repository to `to`, as the build context would
/// hold it: whatever .dockerignore excludes is left out.
fn copy_context(rel: &Path, to: &Path, pats: &[String]) {
    if ignored(rel, pats) {
        return;
    }
    let from = Path::new(ROOT).join(rel);
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for e in std::fs::read_dir(&from).expect("read_dir").flatten() {
            copy_context(&rel.join(e.file_name()), &to.join(e.file_name()), pats);
        }
    } else {
        std::fs::copy(&from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

/// The build stage compiles from exactly what its COPY lines put into the image: a directory
/// holding only those files (minus .dockerignore) passes `cargo check` with the same
/// `--locked` flags, offline, against the crates this machine already fetched.
#[test]
fn dockerfile_build_stage_compiles_from_what_it_copies() {
    let stage = build_stage(&read("docker/Dockerfile"));
    let pats = ignore_patterns();
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tmp.path().join("src-root");
    for (srcs, dest) in &stage.copies {
        let dest = dest.trim_start_matches("./");
        for src in srcs {
            let rel = Path::new(src);
            // `COPY a b ./dir/` puts each source inside dir; `COPY a ./b` names the target.
            let to = if dest.ends_with('/') || dest.is_empty() || srcs.len() > 1 {
                work.join(dest).join(rel.file_name().expect("source name"))
            } else {
                work.join(dest)
            };
            std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
            copy_context(rel, &to, &pats);
        }
    }
    // The image build's flags, less --release (the same sources, checked in the cheaper
    // profile). A target dir of its own next to this build's: cargo test holds the lock on
    // the main one, and reusing it across runs keeps the dependencies checked once.
    let args: Vec<&String> = stage.cargo.iter().filter(|a| *a != "--release").collect();
    let bin = Path::new(env!("CARGO_BIN_EXE_sandpit"));
    let target = bin
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("docker-context-check");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .arg("check")
        .args(&args)
        .arg("--offline")
        .arg("--quiet")
        .current_dir(&work)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTC_WRAPPER")
        .output()
        .expect("run cargo check");
    assert!(
        out.status.success(),
        "the Dockerfile's build stage does not compile from the files it copies \
         (cargo check {args:?} in a copy of them):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn dockerignore_keeps_build_output_and_local_state_out_and_the_image_is_not_root() {
    let pats = ignore_patterns();
    for p in [
        "target",
        "x/node_modules",
        ".sandpit",
        ".venv",
        ".git",
        "fuzz/target",
    ] {
        assert!(ignored(Path::new(p), &pats), ".dockerignore lets {p} in");
    }
    // Nothing the build stage copies is excluded.
    for (srcs, _) in build_stage(&read("docker/Dockerfile")).copies {
        for s in srcs {
            assert!(!ignored(Path::new(&s), &pats), ".dockerignore drops {s}");
        }
    }
    // The final stage runs as the unprivileged user the Dockerfile creates.
    let df = read("docker/Dockerfile");
    let last_stage = df.rsplit("\nFROM ").next().expect("stages");
    let users: Vec<&str> = last_stage
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .collect();
    assert_eq!(users, ["sandpit"], "{users:?}");
    assert!(last_stage.contains("useradd --system --uid 10001"));
}

/// The containers of a pod spec: (name, the text of its entry), from `containers:` on.
fn containers(yaml: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut inside = None;
    for l in yaml.lines() {
        let indent = l.len() - l.trim_start().len();
        if l.trim() == "containers:" {
            inside = Some(indent);
            continue;
        }
        let Some(base) = inside else { continue };
        if !l.trim().is_empty() && indent <= base {
            break;
        }
        if let Some(name) = l
            .trim()
            .strip_prefix("- name: ")
            .filter(|_| indent == base + 2)
        {
            out.push((name.to_string(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(l);
            text.push('\n');
        }
    }
    out
}

#[test]
fn sidecar_gives_the_admin_key_to_the_harness_never_to_the_agent() {
    let s = read("docker/kubernetes/sidecar.yaml");
    let cs = containers(&s);
    let names: Vec<&str> = cs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["harness", "agent", "sandpit"], "{names:?}");
    let with_key: Vec<&str> = cs
        .iter()
        .filter(|(_, t)| t.contains("SANDPIT_ADMIN_KEY") || t.contains("sandpit-admin"))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        with_key,
        ["harness", "sandpit"],
        "admin key in {with_key:?}"
    );
    let agent = &cs[1].1;
    assert!(
        !agent.contains("6433"),
        "the agent has the control API:\n{agent}"
    );
    // The DSN reaches the agent through the volume the harness writes, read-only for it.
    assert!(agent.contains("mountPath: /run/task") && agent.contains("readOnly: true"));
    assert!(cs[0].1.contains("mountPath: /run/task"));
}

/// A container engine that can build here without a registry: its name and whether it can
/// also run containers (buildah builds only).
fn engine_with_base_images(bases: &[String]) -> Option<(&'static str, bool)> {
    let ok = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    for (engine, runs) in [("podman", true), ("docker", true), ("buildah", false)] {
        let has_all = bases.iter().all(|b| match engine {
            "buildah" => ok(engine, &["inspect", "--type", "image", b]),
            _ => ok(engine, &["image", "inspect", b]),
        });
        if has_all {
            return Some((engine, runs));
        }
    }
    None
}

/// An image or container removed however the test ends: (engine, `rmi` or `rm`, its name).
struct Remove<'a>(&'a str, &'a str, &'a str);

impl Drop for Remove<'_> {
    fn drop(&mut self) {
        let _ = Command::new(self.0).args([self.1, "-f", self.2]).output();
    }
}

/// The real image build, then the README's quick start inside a container of it. An optional
/// capability even under CI=true: the CI machines have no container engine and no registry
/// to pull the base images from, so this cannot be promised there; the build-stage check
/// above is what CI relies on.
#[test]
fn image_builds_and_runs_the_quick_start_where_an_engine_is_present() {
    let df = read("docker/Dockerfile");
    let bases: Vec<String> = df
        .lines()
        .filter_map(|l| l.trim().strip_prefix("FROM "))
        .filter_map(|f| f.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let found = engine_with_base_images(&bases);
    if !require::optional(
        found.is_some(),
        "a container engine with the base images",
        &format!("no podman/docker/buildah holding {bases:?} locally"),
    ) {
        return;
    }
    let (engine, runs) = found.expect("checked");
    let tag = format!("sandpit-test:{}", std::process::id());
    let build_args: &[&str] = match engine {
        "buildah" => &["bud", "--pull-never"],
        _ => &["build", "--pull=never"],
    };
    let out = Command::new(engine)
        .args(build_args)
        .args(["-f", "docker/Dockerfile", "-t", &tag, "."])
        .current_dir(ROOT)
        .output()
        .expect("run the image build");
    assert!(
        out.status.success(),
        "{engine} build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _image = Remove(engine, "rmi", &tag);
    if require::optional(
        runs,
        "a container runtime",
        "buildah builds but does not run",
    ) {
        quick_start_in_container(engine, &tag);
    }
}

/// The README's quick start against a container of the image: healthy, a token issued, the
/// destructive statement on its scratch copy, the token revoked.
fn quick_start_in_container(engine: &str, tag: &str) {
    let name = format!("sandpit-test-{}", std::process::id());
    let run = |args: &[&str]| {
        Command::new(engine)
            .args(args)
            .output()
            .expect("run the container engine")
    };
    let started = run(&["run", "-d", "--rm", "--name", &name, tag]);
    assert!(started.status.success(), "{started:?}");
    let _container = Remove(engine, "rm", &name);
    let exec = |cmd: &[&str]| {
        let mut a = vec!["exec", name.as_str()];
        a.extend_from_slice(cmd);
        run(&a)
    };
    // The first start builds the demo golden (the Dockerfile's health check allows 180 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while !exec(&["curl", "-fsS", "http://127.0.0.1:6433/healthz"])
        .status
        .success()
    {
        assert!(std::time::Instant::now() < deadline, "never healthy");
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    let conf = "/etc/sandpit/sandpit.toml";
    let issued = exec(&[
        "sandpit", "token", "issue", "--config", conf, "--task", "t", "--ttl", "15m",
    ]);
    assert!(issued.status.success(), "{issued:?}");
    // The DSN names the compose service (public_host); inside the container it is loopback.
    let dsn = String::from_utf8_lossy(&issued.stdout)
        .trim()
        .replace("@sandpit:", "@127.0.0.1:");
    let del = exec(&[
        "psql",
        &dsn,
        "-c",
        "DELETE FROM orders WHERE status = 'pending' OR TRUE",
    ]);
    assert!(del.status.success(), "{del:?}");
    assert!(
        String::from_utf8_lossy(&del.stdout).contains("DELETE "),
        "{del:?}"
    );
    let revoked = exec(&["sandpit", "token", "revoke", "--config", conf, &dsn]);
    assert!(revoked.status.success(), "{revoked:?}");
}
