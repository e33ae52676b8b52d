//! Client compatibility matrix: every client runs the same scenario (tests/clients/) through
//! one real gateway on the embedded `instance` provider, each on a token of its own, and
//! the results are rendered into `<target>/client-matrix.md` (copied into docs/clients.md by
//! `tests/clients/update-client-matrix.sh`). Plus the protocol-completeness checks that need a
//! hand-built wire exchange (tests/agent/clients/protocol.rs).
//!
//! The gateway is configured with `cleartext_on_loopback = false`, so a cleartext login that
//! works proves the client really used TLS.

use crate::support::harness;
mod matrix;
mod more_drivers;
mod protocol;
mod sqlx_client;
mod tokio_pg;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::harness::{Gateway, SMALL_GOLDEN};
use matrix::{Outcome, Report};

/// Gateway config for the matrix: cleartext only over TLS, even from loopback.
const CONFIG: &str = "[limits]\ncleartext_on_loopback = false\n";

/// One client's way in: the DSN exactly as `token issue` printed it, and the cleartext form.
pub struct Target {
    /// `postgresql://<id>:<secret>@127.0.0.1:<port>/sandpit` (SCRAM).
    pub dsn: String,
    /// `postgresql://agent:<id>.<secret>@127.0.0.1:<port>/sandpit?sslmode=require`.
    pub dsn_cleartext: String,
    pub id: String,
    pub secret: String,
    pub port: u16,
}

/// The matrix gateway (small golden), shared by the tests of this binary. Started from a
/// thread that lives as long as the process, so PDEATHSIG fires only when the process ends.
pub fn gateway() -> &'static Gateway {
    static G: OnceLock<&'static Gateway> = OnceLock::new();
    G.get_or_init(|| harness::process_gateway(|| Gateway::start(Some(SMALL_GOLDEN), Some(CONFIG))))
}

/// Issue a token for one client: enough connections for pgbench -c 8, every cap (rows,
/// bytes, timeouts) left at the gateway's default, as a new user would get it.
pub fn target(task: &str) -> Target {
    let g = gateway();
    let v = g.issue_with(serde_json::json!({
        "task": task, "ttl_seconds": 3600, "max_connections": 16
    }));
    let dsn = v["dsn"].as_str().expect("dsn").to_string();
    let id = v["id"].as_str().expect("id").to_string();
    // postgresql://<id>:<secret>@host:port/db
    let secret = dsn
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .and_then(|(cred, _)| cred.split_once(':'))
        .map(|(_, s)| s.to_string())
        .expect("secret in dsn");
    let dsn_cleartext = format!(
        "postgresql://agent:{id}.{secret}@127.0.0.1:{}/sandpit?sslmode=require",
        g.pg_port
    );
    Target {
        dsn,
        dsn_cleartext,
        id,
        secret,
        port: g.pg_port,
    }
}

fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// Every scenario step must pass, except `allowed_skips` (said plainly in the matrix) and the
/// capped SELECT unless `caps`.
fn check(
    client: &str,
    report: &Report,
    exit_ok: bool,
    extras: &[&str],
    allowed_skips: &[&str],
    caps: bool,
    log: &str,
) {
    matrix::record(client, report, exit_ok);
    let mut problems = report.failures();
    for (step, _) in matrix::SCENARIO {
        if *step == "capped_select" && !caps {
            continue;
        }
        match report.steps.get(*step) {
            Some((Outcome::Ok, _)) => {}
            Some((Outcome::Skip, d)) if allowed_skips.contains(step) => {
                assert!(!d.is_empty(), "{client}: skipped {step} without saying why");
            }
            Some((Outcome::Fail, _)) => {}
            other => problems.push(format!("{step}: {other:?}")),
        }
    }
    for step in extras {
        match report.steps.get(*step) {
            Some((Outcome::Ok, _)) => {}
            Some((Outcome::Skip, d)) if allowed_skips.contains(step) && !d.is_empty() => {}
            other => problems.push(format!("{step}: {other:?}")),
        }
    }
    if !exit_ok {
        problems.push("the client process failed".into());
    }
    assert!(
        problems.is_empty(),
        "{client} failed the scenario:\n  {}\n--- other output:\n{}\n--- stderr:\n{log}\n--- gateway:\n{}",
        problems.join("\n  "),
        report.other.join("\n"),
        gateway().log_problems()
    );
}

/// Run an external client program with the target in its environment; kill it after `limit`.
fn run_program(
    mut cmd: Command,
    t: &Target,
    caps: bool,
    limit: Duration,
) -> (Report, bool, String) {
    cmd.env("SANDPIT_DSN", &t.dsn)
        .env("SANDPIT_DSN_CLEARTEXT", &t.dsn_cleartext)
        .env("SANDPIT_CAPS", if caps { "1" } else { "0" })
        .env_remove("PGPASSWORD")
        .env_remove("PGOPTIONS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let pid = child.id() as i32;
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(o) => break o.expect("client output"),
            Err(_) if start.elapsed() > limit => {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                let o = rx.recv().expect("client output").expect("client output");
                let mut stderr = String::from_utf8_lossy(&o.stderr).into_owned();
                stderr.push_str("\n(killed: time limit)");
                return (
                    Report::parse(&String::from_utf8_lossy(&o.stdout)),
                    false,
                    stderr,
                );
            }
            Err(_) => {}
        }
    };
    (
        Report::parse(&String::from_utf8_lossy(&out.stdout)),
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn psql_client(caps: bool) {
    let t = target("client-psql");
    let mut cmd = Command::new("bash");
    cmd.arg(clients_dir().join("psql.sh"));
    let (r, ok, log) = run_program(cmd, &t, caps, Duration::from_secs(300));
    check(
        "psql",
        &r,
        ok,
        &[
            "describe",
            "meta_copy",
            "large_object",
            "terminate_self",
            "write_returning_uncapped",
            "two_phase",
        ],
        TWO_PHASE_GATED,
        caps,
        &log,
    );
}

fn psycopg_client(caps: bool) {
    let t = target("client-psycopg");
    let python = std::env::var("SANDPIT_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = Command::new(python);
    cmd.arg(clients_dir().join("psycopg_scenario.py"));
    let (r, ok, log) = run_program(cmd, &t, caps, Duration::from_secs(300));
    check(
        "psycopg",
        &r,
        ok,
        &[
            "pipeline",
            "direct_tls",
            "notify_backend_pid",
            "terminate_self",
            "two_phase",
            "write_returning_uncapped",
            "catalog_uncapped",
            "orm_django_bulk_create",
            "orm_sqlalchemy_flush",
        ],
        TWO_PHASE_GATED,
        caps,
        &log,
    );
}

fn node_client(caps: bool) {
    let t = target("client-node");
    let dir = clients_dir().join("node");
    assert!(
        dir.join("node_modules/pg").exists(),
        "node-postgres is not installed: run `npm ci` in tests/clients/node (scripts/setup-dev.sh does)"
    );
    let mut cmd = Command::new("node");
    cmd.arg(dir.join("scenario.js")).current_dir(&dir);
    let (r, ok, log) = run_program(cmd, &t, caps, Duration::from_secs(300));
    check(
        "node-postgres",
        &r,
        ok,
        &["notify_backend_pid", "terminate_self", "two_phase"],
        TWO_PHASE_GATED,
        caps,
        &log,
    );
}

/// Two-phase commit needs `max_prepared_transactions` > 0 on the scratch server; until the
/// gateway configures it the step skips and says so.
const TWO_PHASE_GATED: &[&str] = &["two_phase"];

/// postgres.js runs only the steps where it differs from node-postgres (tests/clients/node/
/// postgresjs_scenario.js): its connect-time read of every array type in pg_type.
fn postgresjs_client() {
    let t = target("client-postgresjs");
    let dir = clients_dir().join("node");
    assert!(
        dir.join("node_modules/postgres").exists(),
        "postgres.js is not installed: run `npm ci` in tests/clients/node (scripts/setup-dev.sh does)"
    );
    let mut cmd = Command::new("node");
    cmd.arg(dir.join("postgresjs_scenario.js"))
        .current_dir(&dir);
    let (r, ok, log) = run_program(cmd, &t, true, Duration::from_secs(300));
    matrix::record("postgres.js", &r, ok);
    let mut problems = r.failures();
    for step in ["connect_scram", "enum_array_fresh", "terminate_self"] {
        if !matches!(r.steps.get(step), Some((Outcome::Ok, _))) {
            problems.push(format!("{step}: {:?}", r.steps.get(step)));
        }
    }
    assert!(
        ok && problems.is_empty(),
        "postgres.js: {problems:?}\n{}\n{log}\n--- gateway:\n{}",
        r.other.join("\n"),
        gateway().log_problems()
    );
}

/// A Rust client's scenario run: its STEP lines.
type ScenarioFuture = std::pin::Pin<Box<dyn std::future::Future<Output = String>>>;

fn rust_client(
    client: &str,
    task: &str,
    caps: bool,
    extras: &[&str],
    allowed_skips: &[&str],
    run: fn(Target, bool) -> ScenarioFuture,
) {
    let t = target(task);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async move {
        tokio::time::timeout(Duration::from_secs(300), run(t, caps))
            .await
            .unwrap_or_else(|_| "STEP timeout fail the scenario took over 300 s\n".into())
    });
    let r = Report::parse(&out);
    check(client, &r, true, extras, allowed_skips, caps, "");
}

#[test]
fn psql_runs_the_scenario() {
    psql_client(true);
}

#[test]
fn pgbench_runs_through_the_gateway() {
    let t = target("client-pgbench");
    let mut cmd = Command::new("bash");
    cmd.arg(clients_dir().join("pgbench.sh"))
        .env("PGBENCH_SECONDS", "10");
    let (r, ok, log) = run_program(cmd, &t, false, Duration::from_secs(400));
    matrix::record("pgbench", &r, ok);
    let mut problems = r.failures();
    for step in [
        "pgbench_init",
        "pgbench_simple",
        "pgbench_extended",
        "pgbench_prepared",
    ] {
        if !matches!(r.steps.get(step), Some((Outcome::Ok, _))) {
            problems.push(format!("{step}: {:?}", r.steps.get(step)));
        }
    }
    assert!(
        ok && problems.is_empty(),
        "pgbench: {problems:?}\n{}\n{log}\n--- gateway:\n{}",
        r.other.join("\n"),
        gateway().log_problems()
    );
}

#[test]
fn psycopg_runs_the_scenario() {
    psycopg_client(true);
}

#[test]
fn asyncpg_runs_the_scenario() {
    more_drivers::asyncpg();
}

#[test]
fn pgx_runs_the_scenario() {
    more_drivers::pgx();
}

#[test]
fn pgjdbc_runs_the_scenario() {
    more_drivers::pgjdbc();
}

#[test]
fn node_postgres_runs_the_scenario() {
    node_client(true);
}

#[test]
fn postgresjs_runs_its_steps() {
    postgresjs_client();
}

#[test]
fn tokio_postgres_runs_the_scenario() {
    rust_client(
        "tokio-postgres",
        "client-tokio-postgres",
        true,
        &["write_returning_uncapped", "two_phase", "terminate_self"],
        TWO_PHASE_GATED,
        |t, caps| Box::pin(tokio_pg::scenario(t, caps)),
    );
}

#[test]
fn sqlx_runs_the_scenario() {
    rust_client(
        "sqlx",
        "client-sqlx",
        true,
        &["two_phase", "terminate_self"],
        &[sqlx_client::SKIPS, TWO_PHASE_GATED].concat(),
        |t, caps| Box::pin(sqlx_client::scenario(t, caps)),
    );
}
