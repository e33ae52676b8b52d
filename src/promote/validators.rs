//! Validators: per golden, checks run against a task's scratch database when its token
//! ends. An SQL validator is a SELECT that must return no rows, run like the review reads
//! (the review's own role, never a superuser, search path `pg_catalog, pg_temp`, read
//! only); a command validator is a program given the scratch database in `PG*` variables.
//! A failing validator blocks approval.

use std::process::Stdio;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::config::ValidatorSection;
use crate::pgconn::{BackendAddr, BackendTarget};
use crate::review::conn::{Side, Timeouts};
use crate::review::escape::cap;

/// Rows of a failing SQL validator shown.
const ROWS_SHOWN: usize = 5;
/// Output of a command validator kept.
const OUTPUT_MAX: usize = 2000;

/// The result of one validator.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ValidatorResult {
    /// Its name.
    pub name: String,
    /// sql or command.
    pub kind: String,
    /// Whether it passed.
    pub passed: bool,
    /// What it found (rows, output, error).
    pub detail: String,
}

/// The validators of `cfg` that apply to `golden`.
pub fn for_golden<'a>(
    cfg: &'a [ValidatorSection],
    golden: Option<&str>,
) -> Vec<&'a ValidatorSection> {
    cfg.iter()
        .filter(|v| {
            v.goldens.is_empty() || golden.is_some_and(|g| v.goldens.iter().any(|x| x == g))
        })
        .collect()
}

/// Run `validators` against `scratch` (the review's login to the scratch database).
pub async fn run(
    validators: &[&ValidatorSection],
    scratch: &BackendTarget,
) -> Vec<ValidatorResult> {
    let mut out = Vec::new();
    for v in validators {
        let r = match (&v.sql, &v.command) {
            (Some(sql), _) => run_sql(v, sql, scratch).await,
            // A gated login (template) is open for the command's run: the token has ended,
            // so no session of the agent's is left to race it.
            (None, Some(cmd)) => crate::pgconn::gate::login(
                scratch,
                async |t: &BackendTarget| Ok::<_, String>(run_command(v, cmd, t).await),
                |e| e,
            )
            .await
            .unwrap_or_else(|e| ValidatorResult {
                name: v.name.clone(),
                kind: "command".into(),
                passed: false,
                detail: format!("the scratch database's login could not be opened: {e}"),
            }),
            (None, None) => ValidatorResult {
                name: v.name.clone(),
                kind: "none".into(),
                passed: false,
                detail: "neither sql nor command".into(),
            },
        };
        metrics::counter!("sandpit_validator_runs_total", "result" => if r.passed { "pass" } else { "fail" })
            .increment(1);
        out.push(r);
    }
    out
}

async fn run_sql(v: &ValidatorSection, sql: &str, scratch: &BackendTarget) -> ValidatorResult {
    let t = Timeouts {
        statement: v.timeout,
        lock: v.timeout,
    };
    let mut res = ValidatorResult {
        name: v.name.clone(),
        kind: "sql".into(),
        passed: false,
        detail: String::new(),
    };
    let body = sql.trim().trim_end_matches(';');
    let q = format!(
        "SELECT * FROM ({body}) AS sandpit_validator LIMIT {}",
        ROWS_SHOWN + 1
    );
    let rows = async {
        let side = Side::connect("scratch", scratch, t).await?;
        side.begin().await?;
        let rows = side.rows(&q).await;
        let _ = side.rollback().await;
        rows
    }
    .await;
    match rows {
        Ok(rows) if rows.is_empty() => {
            res.passed = true;
            res.detail = "no rows".into();
        }
        Ok(rows) => {
            let shown: Vec<String> = rows
                .iter()
                .take(ROWS_SHOWN)
                .map(|r| {
                    let cells: Vec<String> = r
                        .iter()
                        .map(|c| c.clone().unwrap_or_else(|| "NULL".into()))
                        .collect();
                    format!("({})", cap(&cells.join(", "), 200))
                })
                .collect();
            let more = if rows.len() > ROWS_SHOWN { " …" } else { "" };
            res.detail = format!("returned rows: {}{more}", shown.join(" "));
        }
        Err(e) => res.detail = format!("error: {e}"),
    }
    res
}

async fn run_command(
    v: &ValidatorSection,
    cmd: &[String],
    scratch: &BackendTarget,
) -> ValidatorResult {
    let mut res = ValidatorResult {
        name: v.name.clone(),
        kind: "command".into(),
        passed: false,
        detail: String::new(),
    };
    let (host, port) = match &scratch.endpoint.addr {
        BackendAddr::Unix(p) => {
            let dir = p
                .parent()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            let port = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.rsplit('.').next())
                .unwrap_or("5432")
                .to_string();
            (dir, port)
        }
        BackendAddr::Tcp { host, port } => (host.clone(), port.to_string()),
    };
    let Some((prog, args)) = cmd.split_first() else {
        res.detail = "empty command".into();
        return res;
    };
    let sslmode = if scratch.endpoint.tls.is_some() {
        "require"
    } else {
        "disable"
    };
    let mut c = tokio::process::Command::new(prog);
    c.args(args)
        .env("PGHOST", &host)
        .env("PGPORT", &port)
        .env("PGUSER", &scratch.user)
        .env("PGDATABASE", &scratch.database)
        .env("PGSSLMODE", sslmode)
        .env(
            "PGOPTIONS",
            "-c search_path=pg_catalog,pg_temp -c default_transaction_read_only=on",
        )
        .env(
            "SANDPIT_SCRATCH_DSN",
            format!(
                "host={host} port={port} user={} dbname={} sslmode={sslmode}",
                scratch.user, scratch.database
            ),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    match &scratch.password {
        Some(p) => c.env("PGPASSWORD", p),
        None => c.env_remove("PGPASSWORD"),
    };
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            res.detail = format!("could not start {prog}: {e}");
            return res;
        }
    };
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let read = async {
        let mut o = Vec::new();
        let mut e = Vec::new();
        // Both at once: a child filling one pipe must not wait on the other being read.
        let read_out = async {
            if let Some(s) = out.as_mut() {
                let _ = s.take(64 * 1024).read_to_end(&mut o).await;
            }
        };
        let read_err = async {
            if let Some(s) = err.as_mut() {
                let _ = s.take(64 * 1024).read_to_end(&mut e).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, o, e)
    };
    match tokio::time::timeout(v.timeout, read).await {
        Err(_) => res.detail = format!("timed out after {}s", v.timeout.as_secs()),
        Ok((status, o, e)) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
            let text = cap(text.trim(), OUTPUT_MAX);
            match status {
                Ok(s) if s.success() => {
                    res.passed = true;
                    res.detail = if text.is_empty() {
                        "exit 0".into()
                    } else {
                        text
                    };
                }
                Ok(s) => res.detail = format!("{s}: {text}"),
                Err(e) => res.detail = format!("waiting for {prog}: {e}"),
            }
        }
    }
    res
}
