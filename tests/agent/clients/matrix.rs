//! Scenario results: the `STEP name ok|fail|skip detail` lines every client prints, and the
//! client matrix rendered from them into `<target>/client-matrix.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Steps every client runs, in the order docs/clients.md lists them.
pub const SCENARIO: &[(&str, &str)] = &[
    ("connect_scram", "connect with the issued DSN (SCRAM)"),
    (
        "connect_tls_cleartext",
        "user `agent`, password `<id>.<secret>`, sslmode=require",
    ),
    (
        "channel_binding",
        "SCRAM-SHA-256-PLUS, channel binding required",
    ),
    ("create_table", "CREATE TABLE"),
    ("insert_params", "INSERT with parameters"),
    ("prepared_reuse", "one prepared statement, executed 3 times"),
    ("transaction_rollback", "transaction rolled back"),
    ("savepoint", "ROLLBACK TO SAVEPOINT"),
    ("copy_in", "COPY FROM STDIN"),
    ("copy_out", "COPY TO STDOUT"),
    ("listen_notify", "LISTEN/NOTIFY across two connections"),
    (
        "cancel",
        "cancel `pg_sleep(30)` with the client's cancel API",
    ),
    (
        "unique_violation",
        "unique violation arrives as SQLSTATE 23505",
    ),
    (
        "types_roundtrip",
        "NUMERIC, JSONB, timestamptz, bytea, array round trip",
    ),
    ("cursor", "server-side cursor, fetched in batches"),
    (
        "capped_select",
        "100k-row SELECT returns 200 rows and a NOTICE (SANDPIT_CAPS=1)",
    ),
];

/// Steps only some clients have.
pub const EXTRAS: &[(&str, &str)] = &[
    ("describe", "psql `\\d`"),
    ("meta_copy", "psql `\\copy` out and in"),
    (
        "large_object",
        "`\\lo_import`/`\\lo_export` round trip (FunctionCall)",
    ),
    ("pipeline", "psycopg pipeline mode"),
    (
        "pgx_batch",
        "pgx `SendBatch`: 101 statements in one pipeline, one Sync; an error in one skips the rest",
    ),
    (
        "direct_tls",
        "direct TLS (`sslnegotiation=direct`, ALPN `postgresql`; libpq 17+)",
    ),
    (
        "notify_backend_pid",
        "LISTEN/NOTIFY on one connection: the notification's pid is the driver's backend pid",
    ),
    (
        "terminate_self",
        "`pg_terminate_backend(own pid)` raises the driver's admin-shutdown error (57P01)",
    ),
    (
        "two_phase",
        "`PREPARE TRANSACTION` / `COMMIT PREPARED` (n/a while `max_prepared_transactions` = 0)",
    ),
    (
        "write_returning_uncapped",
        "`INSERT`/`UPDATE … RETURNING` of 500 rows: every row (default caps)",
    ),
    (
        "catalog_uncapped",
        "every row of `pg_catalog.pg_type` (over 200; default caps)",
    ),
    (
        "orm_django_bulk_create",
        "Django `bulk_create` of 1000 objects, every key returned (default caps)",
    ),
    (
        "orm_sqlalchemy_flush",
        "SQLAlchemy `add_all` + `flush()` of 1000 objects, `insert().returning()` of 1000",
    ),
    (
        "enum_array_fresh",
        "user enum array decoded on a fresh connection, over 200 array types in `pg_type`",
    ),
    ("pgbench_init", "`pgbench -i -s 5`"),
    ("pgbench_simple", "`pgbench -c 8 -M simple`, zero failures"),
    (
        "pgbench_extended",
        "`pgbench -c 8 -M extended`, zero failures",
    ),
    (
        "pgbench_prepared",
        "`pgbench -c 8 -M prepared`, zero failures",
    ),
];

/// Outcome of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail,
    Skip,
}

/// What one client run reported.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Client name and version as it reported them.
    pub version: String,
    /// step → (outcome, detail).
    pub steps: BTreeMap<String, (Outcome, String)>,
    /// Lines that were not STEP/VERSION lines (for failure messages).
    pub other: Vec<String>,
}

impl Report {
    /// Parse a client's stdout.
    pub fn parse(stdout: &str) -> Report {
        let mut r = Report::default();
        for line in stdout.lines() {
            if let Some(v) = line.strip_prefix("VERSION ") {
                r.version = v.trim().to_string();
                continue;
            }
            let Some(rest) = line.strip_prefix("STEP ") else {
                r.other.push(line.to_string());
                continue;
            };
            let mut it = rest.splitn(3, ' ');
            let name = it.next().unwrap_or("").to_string();
            let outcome = match it.next().unwrap_or("") {
                "ok" => Outcome::Ok,
                "skip" => Outcome::Skip,
                _ => Outcome::Fail,
            };
            let detail = it.next().unwrap_or("").trim().to_string();
            // A step reported twice keeps its worst outcome.
            let keep_old = matches!(r.steps.get(&name), Some((Outcome::Fail, _)));
            if !keep_old {
                r.steps.insert(name, (outcome, detail));
            }
        }
        r
    }

    /// Steps that failed, with details.
    pub fn failures(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter(|(_, (o, _))| *o == Outcome::Fail)
            .map(|(n, (_, d))| format!("{n}: {d}"))
            .collect()
    }
}

/// `<target>/client-matrix/`: one file per client run.
fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|p| p.join("client-matrix"))
        .unwrap_or_else(|| PathBuf::from("target/client-matrix"))
}

/// Record one client's run, then re-render `<target>/client-matrix.md` from every run on
/// record. A client whose process failed is recorded with its failures.
pub fn record(client: &str, report: &Report, exit_ok: bool) {
    let d = dir();
    let _ = std::fs::create_dir_all(&d);
    let when = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut text = format!(
        "client\t{client}\nversion\t{}\nrun_at\t{when}\nexit_ok\t{exit_ok}\n",
        report.version
    );
    for (name, (o, detail)) in &report.steps {
        let o = match o {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
        };
        let detail = detail.replace(['\t', '\n', '|'], " ");
        text.push_str(&format!("step\t{name}\t{o}\t{detail}\n"));
    }
    let _ = std::fs::write(d.join(format!("{client}.tsv")), text);
    render();
}

/// Column order of the clients in the matrix.
const CLIENTS: &[&str] = &[
    "psql",
    "pgbench",
    "psycopg",
    "asyncpg",
    "node-postgres",
    "postgres.js",
    "tokio-postgres",
    "sqlx",
    "pgx",
    "pgjdbc",
];

/// One client's recorded run: name, metadata, step → (outcome, detail).
type Run = (
    String,
    BTreeMap<String, String>,
    BTreeMap<String, (String, String)>,
);

fn render() {
    let d = dir();
    let mut runs: Vec<Run> = Vec::new();
    for c in CLIENTS {
        let Ok(text) = std::fs::read_to_string(d.join(format!("{c}.tsv"))) else {
            continue;
        };
        let mut meta = BTreeMap::new();
        let mut steps = BTreeMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            match f.as_slice() {
                ["step", name, o, rest @ ..] => {
                    steps.insert(name.to_string(), (o.to_string(), rest.join(" ")));
                }
                [k, v] => {
                    meta.insert(k.to_string(), v.to_string());
                }
                _ => {}
            }
        }
        runs.push((c.to_string(), meta, steps));
    }
    let mut md = String::new();
    md.push_str("| step | ");
    md.push_str(
        &runs
            .iter()
            .map(|(c, m, _)| {
                format!(
                    "{c}<br>{}",
                    m.get("version").map(String::as_str).unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join(" | "),
    );
    md.push_str(" |\n|---|");
    md.push_str(&"---|".repeat(runs.len()));
    md.push('\n');
    for (name, what) in SCENARIO.iter().chain(EXTRAS.iter()) {
        if !runs.iter().any(|(_, _, s)| s.contains_key(*name))
            && EXTRAS.iter().any(|(n, _)| n == name)
        {
            continue;
        }
        md.push_str(&format!("| {what} |"));
        for (_, _, steps) in &runs {
            let cell = match steps.get(*name) {
                Some((o, detail)) => {
                    let mark = match o.as_str() {
                        "ok" => "pass",
                        "skip" => "n/a",
                        _ => "**FAIL**",
                    };
                    if detail.is_empty() {
                        mark.to_string()
                    } else {
                        format!("{mark}: {detail}")
                    }
                }
                None => "—".to_string(),
            };
            md.push_str(&format!(" {cell} |"));
        }
        md.push('\n');
    }
    md.push_str(
        "\npass: the step ran and checked its result; n/a: the client has no such API, or the \
         step is gated (said in the cell); —: not part of this client's run (pgbench runs its \
         own workload).\n\nRuns: ",
    );
    md.push_str(
        &runs
            .iter()
            .map(|(c, m, _)| {
                format!(
                    "{c} {} (exit ok: {})",
                    m.get("run_at").map(String::as_str).unwrap_or("?"),
                    m.get("exit_ok").map(String::as_str).unwrap_or("?")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    );
    md.push('\n');
    if let Some(parent) = d.parent() {
        let _ = std::fs::write(parent.join("client-matrix.md"), md);
    }
}

/// A step's result in the Rust clients: a detail for the matrix, or why it failed.
pub type StepResult = Result<String, String>;

/// `?` with a description, for any error that displays.
pub trait Ctx<T> {
    /// Turn the error into "what: error".
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: std::fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Fail the step unless `got == want`.
pub fn want<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, want {want:?}"))
    }
}

/// Collects STEP lines the way the external clients print them.
#[derive(Default)]
pub struct Steps {
    out: String,
}

impl Steps {
    /// Start with the client's version line.
    pub fn new(version: &str) -> Steps {
        Steps {
            out: format!("VERSION {version}\n"),
        }
    }

    /// Record one step's result.
    pub fn record(&mut self, name: &str, r: StepResult) {
        let line = match r {
            Ok(d) => format!("STEP {name} ok {d}"),
            Err(e) => format!("STEP {name} fail {}", e.replace('\n', " ")),
        };
        self.out.push_str(&line);
        self.out.push('\n');
    }

    /// A step this client cannot do, and why.
    pub fn skip(&mut self, name: &str, why: &str) {
        self.out.push_str(&format!("STEP {name} skip {why}\n"));
    }

    /// The lines, for `Report::parse`.
    pub fn finish(self) -> String {
        self.out
    }
}

/// The version of a crate as Cargo.lock pins it (the Rust clients report this).
pub fn locked_version(name: &str) -> String {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
        .unwrap_or_default();
    let needle = format!("name = \"{name}\"\nversion = \"");
    lock.split_once(&needle)
        .and_then(|(_, rest)| rest.split('"').next())
        .unwrap_or("?")
        .to_string()
}
