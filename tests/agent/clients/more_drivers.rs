//! The drivers with protocol code of their own that come from outside the Rust and npm lock
//! files: asyncpg (PyPI, pinned by scripts/setup-dev.sh), pgx v4 and pgjdbc (Debian's
//! packages, built here with Debian's Go and javac). Each runs the common scenario and the
//! same extras; none implements SCRAM-SHA-256-PLUS. Under CI a missing one fails the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{check, clients_dir, run_program, target, TWO_PHASE_GATED};
use crate::support::require::require;

/// The extras every driver here runs.
const EXTRAS: &[&str] = &[
    "notify_backend_pid",
    "terminate_self",
    "two_phase",
    "write_returning_uncapped",
    "catalog_uncapped",
];

/// Debian's pgjdbc (libpostgresql-jdbc-java).
const PGJDBC_JAR: &str = "/usr/share/java/postgresql.jar";

/// Debian's Go sources, pgx v4 among them (golang-github-jackc-pgx-v4-dev), built in GOPATH
/// mode: nothing is downloaded.
const GOPATH: &str = "/usr/share/gocode";

/// Whether `program args…` runs and succeeds (a probe, its output dropped).
fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs a built or installed scenario `cmd` as `client` (its token's task `client-<client>`)
/// and checks the common steps and [`EXTRAS`] (plus `more`).
fn scenario(client: &str, cmd: Command, more: &[&str]) {
    let t = target(&format!("client-{client}"));
    let (r, ok, log) = run_program(cmd, &t, true, Duration::from_secs(300));
    let extras: Vec<&str> = more.iter().chain(EXTRAS).copied().collect();
    let skips = ["channel_binding", TWO_PHASE_GATED[0]];
    check(client, &r, ok, &extras, &skips, true, &log);
}

/// Runs a build step, which must succeed.
fn built(what: &str, cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// asyncpg: named statements and binary results for every query, no libpq.
pub fn asyncpg() {
    let python = std::env::var("SANDPIT_PYTHON").unwrap_or_else(|_| "python3".into());
    let present = runs(&python, &["-c", "import asyncpg"]);
    if !require(
        present,
        "asyncpg",
        "the asyncpg column of the client matrix",
    ) {
        return;
    }
    let mut cmd = Command::new(python);
    cmd.arg(clients_dir().join("asyncpg_scenario.py"));
    scenario("asyncpg", cmd, &[]);
}

/// pgjdbc: compiled here with javac against Debian's jar, run with java.
pub fn pgjdbc() {
    let jar = Path::new(PGJDBC_JAR);
    if !require(
        runs("javac", &["-version"]) && jar.exists(),
        "javac and pgjdbc (/usr/share/java/postgresql.jar)",
        "the pgjdbc column of the client matrix",
    ) {
        return;
    }
    let classes = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("jdbc-scenario");
    let _ = std::fs::remove_dir_all(&classes);
    built(
        "javac",
        Command::new("javac")
            .arg("-d")
            .arg(&classes)
            .arg("-cp")
            .arg(jar)
            .arg(clients_dir().join("jdbc/Scenario.java")),
    );
    let mut cmd = Command::new("java");
    cmd.arg("-cp")
        .arg(format!("{}:{}", jar.display(), classes.display()))
        .arg("Scenario");
    scenario("pgjdbc", cmd, &[]);
}

/// pgx: Go's pure-Go driver, built here with Debian's Go.
pub fn pgx() {
    let sources = Path::new(GOPATH).join("src/github.com/jackc/pgx/v4");
    if !require(
        runs("go", &["version"]) && sources.exists(),
        "go and pgx v4 (golang-github-jackc-pgx-v4-dev)",
        "the pgx column of the client matrix",
    ) {
        return;
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let bin = tmp.join("pgx-scenario");
    built(
        "go build",
        Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(clients_dir().join("pgx"))
            .env("GOPATH", GOPATH)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOCACHE", tmp.join("go-cache")),
    );
    scenario("pgx", Command::new(&bin), &["pgx_batch"]);
}
