//! The harness SDKs (clients/python, clients/typescript): each one's `surface()` covers every
//! route and field of docs/api.yaml (read now, so a route or field added there fails this
//! until the SDKs have it); each package builds (`pip wheel`, `npm pack`), installs into a
//! clean virtualenv / folder, and its own suite runs from that install against one real
//! gateway whose promote target is a real Postgres database.

use crate::support::harness;
mod api_spec;
use crate::support::shared_pg;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::support::harness::Gateway;
use api_spec::{api_ops, drift, sdk_ops, yaml};
use serde_json::Value;

/// psycopg as tests/agent/clients.rs pins it; pytest for the suite; setuptools, the build backend.
const PY_PINS: &[&str] = &[
    "psycopg[binary]==3.3.9",
    "pytest==8.3.5",
    "setuptools==75.8.0",
];
const PG_NODE: &str = "pg@8.23.1";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A missing tool fails under CI=true and skips elsewhere, saying why.
fn have(program: &str, args: &[&str]) -> bool {
    let ok = Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let why = format!("`{program} {}` does not work", args.join(" "));
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why} (bash scripts/setup-dev.sh installs it)"
        );
        eprintln!("skipped: {why}");
    }
    ok
}

/// Runs `cmd`; its stdout, or a panic with both streams.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    stdout
}

fn api_doc() -> Value {
    let text = std::fs::read_to_string(root().join("docs/api.yaml")).expect("docs/api.yaml");
    yaml::parse(&text).unwrap_or_else(|e| panic!("docs/api.yaml: {e}"))
}

fn python_surface() -> Value {
    let out = run(
        Command::new("python3")
            .args([
                "-c",
                "import json, sandpit; print(json.dumps(sandpit.surface()))",
            ])
            .env("PYTHONPATH", root().join("clients/python/src")),
        "python surface",
    );
    serde_json::from_str(&out).expect("python surface JSON")
}

/// `npm ci` (when node_modules is missing or stale) and the TypeScript build, once.
fn ts_built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = root().join("clients/typescript");
        let lock = dir.join("package-lock.json");
        let installed = dir.join("node_modules/.package-lock.json");
        let stale = match (std::fs::metadata(&lock), std::fs::metadata(&installed)) {
            (Ok(l), Ok(i)) => l.modified().ok() > i.modified().ok(),
            _ => true,
        };
        if stale {
            run(
                Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                    .current_dir(&dir),
                "npm ci in clients/typescript",
            );
        }
        run(
            Command::new("npm").args(["run", "build"]).current_dir(&dir),
            "tsc",
        );
        dir
    })
}

fn ts_surface() -> Value {
    let out = run(
        Command::new("node")
            .args([
                "--input-type=module",
                "-e",
                "import {surface} from './dist/index.js'; console.log(JSON.stringify(surface()))",
            ])
            .current_dir(ts_built()),
        "typescript surface",
    );
    serde_json::from_str(&out).expect("typescript surface JSON")
}

#[test]
fn api_yaml_is_read_whole_and_an_added_route_or_field_is_drift() {
    let ops = api_ops(&api_doc());
    assert!(ops.len() >= 25, "{:?}", ops.keys());
    let issue = &ops[&("POST".to_string(), "/v1/tokens".to_string())];
    assert!(issue.request.contains("ttl_seconds") && issue.response.contains("dsn"));
    let st = &ops[&("GET".to_string(), "/v1/tokens/{id}/statements".to_string())];
    assert!(st.query.contains("after") && st.response.contains("outcome.sqlstate"));
    // The check fails when api.yaml gains a route or a field the SDK lacks.
    let text = std::fs::read_to_string(root().join("docs/api.yaml")).expect("api.yaml");
    let grown = text
        .replacen(
            "\npaths:\n",
            "\npaths:\n  /v1/tokens/{id}/archive:\n    post:\n      responses:\n        '200': {description: gone}\n",
            1,
        )
        .replacen(
            "        sessions: {type: integer",
            "        review_state: {type: string}\n        sessions: {type: integer",
            1,
        );
    assert_ne!(grown, text, "the fixture edits no longer apply to api.yaml");
    let sdk = sdk_ops(&python_surface());
    assert_eq!(drift(&ops, &sdk), Vec::<String>::new());
    let gaps = drift(&api_ops(&yaml::parse(&grown).expect("grown")), &sdk);
    assert!(
        gaps.contains(&"route POST /v1/tokens/{id}/archive".to_string()),
        "{gaps:?}"
    );
    assert!(
        gaps.contains(&"GET /v1/tokens/{id}: response field review_state".to_string()),
        "{gaps:?}"
    );
}

#[test]
fn python_sdk_covers_every_route_and_field_of_api_yaml() {
    if !have("python3", &["--version"]) {
        return;
    }
    let gaps = drift(&api_ops(&api_doc()), &sdk_ops(&python_surface()));
    assert!(
        gaps.is_empty(),
        "clients/python lacks what docs/api.yaml has:\n{}",
        gaps.join("\n")
    );
}

#[test]
fn typescript_sdk_covers_every_route_and_field_of_api_yaml() {
    if !have("node", &["--version"]) || !have("npm", &["--version"]) {
        return;
    }
    let gaps = drift(&api_ops(&api_doc()), &sdk_ops(&ts_surface()));
    assert!(
        gaps.is_empty(),
        "clients/typescript lacks what docs/api.yaml has:\n{}",
        gaps.join("\n")
    );
}

/// Wheels for the offline installs: target/sdk-wheelhouse (`.ci/run` fills it; else here).
fn wheelhouse() -> PathBuf {
    let dir = root().join("target/sdk-wheelhouse");
    let have_all = std::fs::read_dir(&dir).is_ok_and(|d| {
        let names: Vec<String> = d
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        [
            "psycopg-3.3.9",
            "psycopg_binary-3.3.9",
            "pytest-8.3.5",
            "setuptools-75.8.0",
        ]
        .iter()
        .all(|p| names.iter().any(|n| n.starts_with(p)))
    });
    if !have_all {
        eprintln!("downloading {PY_PINS:?} into {}", dir.display());
        run(
            Command::new("python3")
                .args(["-m", "pip", "download", "--quiet", "--dest"])
                .arg(&dir)
                .args(PY_PINS),
            "pip download",
        );
    }
    dir
}

/// Builds the wheel, installs it into a clean venv, runs clients/python/tests from it.
fn python_suite(g: &Gateway, work: &Path) -> String {
    let wh = wheelhouse();
    std::fs::create_dir_all(work).expect("mkdir");
    let src = work.join("src");
    run(
        Command::new("cp")
            .arg("-a")
            .arg(root().join("clients/python"))
            .arg(&src),
        "copy clients/python",
    );
    let dist = work.join("dist");
    let offline = |c: &mut Command| {
        c.args(["--no-index", "--find-links"]).arg(&wh);
    };
    let mut wheel = Command::new("python3");
    wheel
        .args(["-m", "pip", "wheel", "--quiet", "--no-deps", "-w"])
        .arg(&dist);
    offline(&mut wheel);
    run(wheel.arg(&src), "pip wheel clients/python");
    let whl = std::fs::read_dir(&dist)
        .expect("dist")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a wheel");
    let venv = work.join("venv");
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    let py = venv.join("bin/python");
    let mut install = Command::new(&py);
    install.args(["-m", "pip", "install", "--quiet"]);
    offline(&mut install);
    install
        .arg(format!("sandpit-client[sql] @ file://{}", whl.display()))
        .arg("pytest==8.3.5");
    run(&mut install, "pip install the wheel into a clean venv");
    run(
        Command::new("cp")
            .arg("-a")
            .arg(root().join("clients/python/tests"))
            .arg(work.join("pytests")),
        "copy the suite",
    );
    run(
        Command::new(&py)
            .args([
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-rs",
                "-q",
                "pytests",
            ])
            .current_dir(work)
            .env_remove("PYTHONPATH")
            .env("SANDPIT_API", &g.api)
            .env("SANDPIT_ADMIN_KEY", &g.admin_key)
            .env("SANDPIT_TEST_TARGET", "default"),
        "the Python SDK suite",
    )
}

/// Packs the TypeScript package, installs the tarball into a clean folder, runs its suite.
fn node_suite(g: &Gateway, work: &Path) -> String {
    let dir = ts_built();
    std::fs::create_dir_all(work).expect("mkdir");
    let name = run(
        Command::new("npm")
            .args(["pack", "--silent", "--pack-destination"])
            .arg(work)
            .current_dir(dir),
        "npm pack",
    );
    let tgz = work.join(name.trim().lines().last().unwrap_or_default());
    assert!(tgz.is_file(), "no tarball at {}", tgz.display());
    let app = work.join("app");
    std::fs::create_dir_all(&app).expect("mkdir");
    std::fs::write(
        app.join("package.json"),
        "{\"name\":\"sdk-suite\",\"private\":true,\"type\":\"module\"}\n",
    )
    .expect("package.json");
    run(
        Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--prefer-offline",
                "--loglevel=error",
            ])
            .arg(&tgz)
            .arg(PG_NODE)
            .current_dir(&app),
        "npm install the tarball into a clean folder",
    );
    std::fs::copy(dir.join("test/sdk.test.mjs"), app.join("sdk.test.mjs")).expect("copy suite");
    run(
        Command::new("node")
            .args(["--test", "sdk.test.mjs"])
            .current_dir(&app)
            .env("SANDPIT_API", &g.api)
            .env("SANDPIT_ADMIN_KEY", &g.admin_key)
            .env("SANDPIT_TEST_TARGET", "default"),
        "the TypeScript SDK suite",
    )
}

/// A gateway whose `[promote.targets].default` is a real database holding the golden's schema.
async fn gateway_with_target() -> (shared_pg::SharedPg, Gateway) {
    let src = shared_pg::SharedPg::start().await;
    let admin = src.admin("postgres").await;
    for sql in [
        "CREATE ROLE sdk_owner LOGIN",
        "CREATE DATABASE sdk_target OWNER sdk_owner",
    ] {
        admin.batch_execute(sql).await.expect("target db");
    }
    let db = src.admin("sdk_target").await;
    db.batch_execute(&format!("SET ROLE sdk_owner; {}", harness::SMALL_GOLDEN))
        .await
        .expect("target schema");
    let config = format!(
        "[pool]\nsize = 0\n\n[promote.targets.default]\ndsn = \"host={} port={} user=sdk_owner dbname=sdk_target\"\n",
        src.socket_dir.display(),
        src.port
    );
    let g = Gateway::start(Some(harness::SMALL_GOLDEN), Some(&config));
    (src, g)
}

#[test]
fn packages_install_clean_and_their_suites_pass_against_a_gateway() {
    let py_ok =
        have("python3", &["-m", "venv", "--help"]) && have("python3", &["-m", "pip", "--version"]);
    let node_ok = have("node", &["--version"]) && have("npm", &["--version"]);
    if !py_ok && !node_ok {
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (src, g) = rt.block_on(gateway_with_target());
    let work = harness::tempdir();
    let (py, node) = std::thread::scope(|s| {
        let py = s.spawn(|| py_ok.then(|| python_suite(&g, &work.path().join("py"))));
        let node = s.spawn(|| node_ok.then(|| node_suite(&g, &work.path().join("node"))));
        (py.join(), node.join())
    });
    let py = py.unwrap_or_else(|e| std::panic::resume_unwind(e));
    let node = node.unwrap_or_else(|e| std::panic::resume_unwind(e));
    if let Some(out) = py {
        eprintln!("{out}");
        assert!(
            out.contains(" passed") && !out.contains("skipped") && !out.contains("failed"),
            "{out}"
        );
    }
    if let Some(out) = node {
        eprintln!("{out}");
        assert!(
            out.contains("# fail 0") && out.contains("# skipped 0"),
            "{out}"
        );
        assert!(!out.contains("# pass 0"), "{out}");
    }
    // Whatever the suites did, crashes included, every token they issued ended.
    let (st, v) = g.raw_call("GET", "/v1/tokens", None);
    assert_eq!(st, 200);
    let tokens = v.as_array().expect("list");
    let issued_by = |prefixes: &[&str]| {
        tokens
            .iter()
            .filter(|t| {
                prefixes
                    .iter()
                    .any(|p| t["task"].as_str().is_some_and(|s| s.starts_with(p)))
            })
            .count()
    };
    // 7 tasks of the Python suite and 2 of its fixture; 5 of the TypeScript suite.
    if py_ok {
        assert_eq!(issued_by(&["sdk-py-", "pytest-"]), 9, "{v}");
    }
    if node_ok {
        assert_eq!(issued_by(&["sdk-ts-"]), 5, "{v}");
    }
    for t in tokens {
        assert_eq!(t["state"], "revoked", "{t}");
        assert_eq!(t["backend"], false, "{t}");
    }
    // The dry runs committed nothing to the target.
    let n: i64 = rt.block_on(async {
        let db = src.admin("sdk_target").await;
        db.query_one("SELECT count(*) FROM items", &[])
            .await
            .expect("count")
            .get(0)
    });
    assert_eq!(n, 1000);
}
