//! What an operator meets at the command line: one gateway per data dir, ports checked before
//! the golden build, `--check-config`, a second Ctrl-C that still stops the scratch servers,
//! CLI commands that take a token's DSN for its id and never print its secret, and the
//! superuser opt-in refused by a provider that cannot contain a superuser.

use crate::support::harness;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::harness::{
    pid_alive, run_sandpit, wait_exit, wait_until, Gateway, SMALL_GOLDEN,
};
use serde_json::Value;

fn s(v: &Value, k: &str) -> String {
    v[k].as_str()
        .unwrap_or_else(|| panic!("{k} in {v}"))
        .to_string()
}

fn secret_of(dsn: &str) -> String {
    // postgresql://<id>:<secret>@host:port/db
    let rest = dsn.split_once("://").expect("dsn").1;
    let userinfo = rest.rsplit_once('@').expect("userinfo").0;
    userinfo.split_once(':').expect("password").1.to_string()
}

/// `sandpit serve` on `dir` with the given listeners, stderr captured; waits for it to exit.
fn serve_until_exit(dir: &Path, listen: &str, api_listen: &str) -> (Option<i32>, String) {
    let golden = dir.join("golden.sql");
    if !golden.exists() {
        std::fs::write(&golden, SMALL_GOLDEN).expect("golden");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandpit"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen", listen, "--api-listen", api_listen])
        .arg("--golden-sql")
        .arg(&golden)
        .env_remove("SANDPIT_ADMIN_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sandpit");
    let status = wait_exit(&mut child, Duration::from_secs(60));
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (status.and_then(|s| s.code()), err)
}

/// Pids in the `postmaster.pid` files under `dir` (Postgres servers, not their backends,
/// which come and go with connections).
fn postmasters_under(dir: &Path, depth: u32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("postmaster.pid")) {
        out.extend(
            text.lines()
                .next()
                .and_then(|l| l.trim().parse::<i32>().ok()),
        );
    }
    if depth > 0 {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(postmasters_under(&e.path(), depth - 1));
            }
        }
    }
    out
}

#[test]
fn a_second_gateway_on_the_same_data_dir_is_refused_and_the_first_is_untouched() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    // Fresh from start: every metric described, the main counters at 0 before any event.
    let text = harness::http_ok(
        "GET",
        &format!("{}/metrics", g.api),
        None,
        harness::Body::None,
    )
    .expect("GET /metrics")
    .body;
    for want in [
        "# HELP sandpit_statement_timeouts_total ",
        "# TYPE sandpit_statement_timeouts_total counter",
        "\nsandpit_statement_timeouts_total 0\n",
        "\nsandpit_tokens_issued_total 0\n",
        "\nsandpit_unlogged_refusals_total 0\n",
        "\nsandpit_tokens_ended_total{reason=\"revoked\"} 0\n",
        "# HELP sandpit_sessions ",
    ] {
        assert!(text.contains(want), "/metrics lacks {want:?}:\n{text}");
    }
    let t = g.issue("first-gateway", 600);
    let id = s(&t, "id");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = harness::connect(&s(&t, "dsn")).await.expect("connect");
        c.simple_query("create table kept(x int); insert into kept values (7)")
            .await
            .expect("write");
    });
    // A review starts the review reference backend: the second gateway must not stop it.
    let (code, _) = g.raw_call("GET", &format!("/v1/tokens/{id}/diff"), None);
    assert_eq!(code, 200);
    let m = harness::metrics(&g.api);
    assert!(
        m.keys()
            .any(|k| k.starts_with("sandpit_review_seconds_bucket")),
        "review time is a histogram: {m:?}"
    );
    let servers_before = postmasters_under(&g.data_dir.join("pg"), 4);
    assert!(
        servers_before.len() >= 2,
        "token and reference servers: {servers_before:?}"
    );
    assert!(servers_before.iter().all(|p| pid_alive(*p)));
    let first_pid = g.child.as_ref().expect("child").id();
    let log_before = g.log();
    let tokens_before = std::fs::read_dir(g.data_dir.join("tokens"))
        .expect("tokens")
        .count();

    let (code, err) = serve_until_exit(&g.data_dir, "127.0.0.1:0", "127.0.0.1:0");
    let code = code.unwrap_or_else(|| panic!("second gateway did not exit at once: {err}"));
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&g.data_dir.display().to_string()),
        "the message names the data dir: {err}"
    );
    assert!(
        err.contains(&format!("pid {first_pid}")),
        "the message names the holder: {err}"
    );

    // The first gateway's servers, tokens and sessions are as they were.
    for pid in &servers_before {
        assert!(
            pid_alive(*pid),
            "pid {pid} of the first gateway was stopped"
        );
    }
    let tokens_after = std::fs::read_dir(g.data_dir.join("tokens"))
        .expect("tokens")
        .count();
    assert_eq!(tokens_before, tokens_after);
    assert_eq!(s(&g.show(&id), "state"), "live");
    let kept = rt
        .block_on(harness::query_one(
            &s(&t, "dsn"),
            "select x::text from kept",
        ))
        .expect("first gateway still serves its token");
    assert_eq!(kept.as_deref(), Some("7"));
    let (code, _) = g.raw_call("GET", &format!("/v1/tokens/{id}/diff"), None);
    assert_eq!(code, 200, "the review still works");
    // The second one wrote nothing into the first one's log (it never got that far).
    assert!(g.log().starts_with(&log_before));
    assert_eq!(
        std::fs::read_to_string(g.data_dir.join("gateway.lock"))
            .expect("lock file")
            .trim(),
        first_pid.to_string()
    );
}

#[test]
fn a_port_in_use_is_reported_before_the_golden_build() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy_addr = busy.local_addr().expect("addr").to_string();
    for (listen, api) in [
        (busy_addr.as_str(), "127.0.0.1:0"),
        ("127.0.0.1:0", busy_addr.as_str()),
    ] {
        let tmp = harness::tempdir();
        let (code, err) = serve_until_exit(tmp.path(), listen, api);
        let code = code.unwrap_or_else(|| panic!("serve did not exit: {err}"));
        assert_ne!(code, 0, "{err}");
        assert!(
            err.contains(&format!("cannot listen on {busy_addr}")),
            "{err}"
        );
        // Nothing was built or generated: the port was the first thing looked at.
        for never in ["pg", "admin.key", "tokens", "tls", "gateway.id"] {
            assert!(
                !tmp.path().join(never).exists(),
                "{never} exists after a port clash: {err}"
            );
        }
    }
}

#[test]
fn check_config_reports_what_would_fail_at_start() {
    let tmp = harness::tempdir();
    let write = |name: &str, text: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).expect("write");
        p.to_string_lossy().to_string()
    };
    let data = tmp.path().join("data-not-created");
    let data = data.to_string_lossy().to_string();
    let check = |config: &str, envs: &[(&str, &str)]| {
        run_sandpit(
            &[
                "serve",
                "--check-config",
                "--config",
                config,
                "--data-dir",
                &data,
            ],
            envs,
        )
    };
    let cases = [
        (
            "same-port.toml",
            "listen = \"127.0.0.1:7001\"\napi_listen = \"127.0.0.1:7001\"\n",
            "api_listen",
        ),
        (
            "no-bins.toml",
            "[postgres]\nbin_dir = \"/nonexistent/pg/bin\"\n",
            "postgres.bin_dir",
        ),
        ("empty-key.toml", "admin_key = \"\"\n", "admin_key"),
        (
            "short-key.toml",
            "admin_key = \"0123456789\"\n",
            "admin_key",
        ),
        (
            "ro-data.toml",
            "data_dir = \"/sys/sandpit-check\"\n",
            "data_dir",
        ),
    ];
    for (name, text, key) in cases {
        let p = write(name, text);
        let (code, out, err) = if name == "ro-data.toml" {
            // --data-dir would override the file's data_dir.
            run_sandpit(&["serve", "--check-config", "--config", &p], &[])
        } else {
            check(&p, &[])
        };
        assert_eq!(code, 1, "{name}: {out}{err}");
        assert!(err.contains(key), "{name}: {err}");
        assert!(!err.contains("0123456789"), "the key is not echoed: {err}");
    }
    // The data dir exists as a file.
    let file = write("a-file", "x");
    let (code, _, err) = run_sandpit(&["serve", "--check-config", "--data-dir", &file], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("data_dir"), "{err}");
    // The key from the environment counts too; it is not echoed either.
    let ok = write("ok.toml", "");
    let (code, _, err) = check(&ok, &[("SANDPIT_ADMIN_KEY", "tooshort")]);
    assert_eq!(code, 1);
    assert!(
        err.contains("SANDPIT_ADMIN_KEY") && !err.contains("tooshort"),
        "{err}"
    );
    // All good: ok, and nothing created.
    let long_key = write(
        "long-key.toml",
        &format!("admin_key = \"{}\"\n", "k".repeat(32)),
    );
    let (code, out, err) = check(&long_key, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "config ok");
    assert!(
        !Path::new(&data).exists(),
        "--check-config created the data dir"
    );
}

#[test]
fn the_cli_takes_a_dsn_for_a_token_id_and_never_prints_the_secret() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let t = g.issue("cli-by-dsn", 600);
    let (id, dsn) = (s(&t, "id"), s(&t, "dsn"));
    let secret = secret_of(&dsn);
    let env = [
        ("SANDPIT_API", g.api.as_str()),
        ("SANDPIT_ADMIN_KEY", g.admin_key.as_str()),
    ];
    let no_secret = |what: &str, out: &str, err: &str| {
        assert!(
            !out.contains(&secret) && !err.contains(&secret),
            "{what} printed the secret:\n{out}\n{err}"
        );
    };
    let (ok, _, err) = harness::psql(&dsn, &["-c", "select 1"]);
    assert!(ok, "{err}");

    // show: text by default, JSON with --json; by DSN.
    let (code, out, err) = run_sandpit(&["token", "show", &dsn], &env);
    assert_eq!(code, 0, "{err}");
    no_secret("token show", &out, &err);
    assert!(
        out.lines()
            .any(|l| l.starts_with("id") && l.trim_end().ends_with(&id)),
        "{out}"
    );
    assert!(
        serde_json::from_str::<Value>(&out).is_err(),
        "text, not JSON: {out}"
    );
    let (code, out, err) = run_sandpit(&["token", "show", &dsn, "--json"], &env);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("show --json is JSON");
    assert_eq!(s(&v, "id"), id);

    // list has a header.
    let (code, out, err) = run_sandpit(&["token", "list"], &env);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let header = lines.next().expect("header");
    assert!(
        header.starts_with("ID") && header.contains("STATE"),
        "{out}"
    );
    assert!(lines.any(|l| l.starts_with(&id)), "{out}");

    // log and review by DSN.
    let (code, out, err) = run_sandpit(&["log", &dsn], &env);
    assert_eq!(code, 0, "{err}");
    no_secret("log", &out, &err);
    assert!(out.contains("select 1"), "{out}");
    let (code, out, err) = run_sandpit(&["review", &dsn], &env);
    assert_eq!(code, 0, "{err}");
    no_secret("review", &out, &err);

    // Bad DSNs holding a secret: refused (or unknown), the secret never shown.
    let unknown_id = "sp_abcdefghijklmnopqrst";
    let bad = [
        format!(
            "postgresql://agent:{secret}@127.0.0.1:{}/sandpit",
            g.pg_port
        ),
        format!(
            "postgresql://{unknown_id}:{secret}@127.0.0.1:{}/sandpit",
            g.pg_port
        ),
        format!("postgresql://{id}:{secret}@127.0.0.1:{}/sandpit", g.pg_port)
            .replace(&format!(":{}/", g.pg_port), ":not-a-port/"),
    ];
    for (i, arg) in bad.iter().enumerate() {
        for cmd in [&["token", "revoke"][..], &["token", "show"], &["review"]] {
            if i == 2 {
                continue; // names the real token: done below, once
            }
            let mut args = cmd.to_vec();
            args.push(arg);
            let (code, out, err) = run_sandpit(&args, &env);
            assert_ne!(code, 0, "{args:?}: {out}");
            no_secret(&format!("{args:?}"), &out, &err);
            assert!(!err.trim().is_empty(), "an error is printed");
        }
    }
    let (code, _, err) = run_sandpit(&["token", "revoke", &bad[1]], &env);
    assert_ne!(code, 0);
    assert!(err.contains(unknown_id), "the id may be shown: {err}");
    // An argument clap did not expect is quoted back by clap, with the secret hidden.
    let (code, out, err) = run_sandpit(&["token", "revoke", &id, &dsn], &env);
    assert_ne!(code, 0);
    no_secret("clap error", &out, &err);
    // `sandpit mcp` with a DSN that does not parse.
    let (code, out, err) = run_sandpit(&["mcp", "--dsn", &bad[2]], &[]);
    assert_ne!(code, 0);
    no_secret("mcp", &out, &err);

    // Revoke by the DSN (even an unparsable one naming the token): the token ends.
    let (code, out, err) = run_sandpit(&["token", "revoke", &bad[2]], &env);
    assert_eq!(code, 0, "{err}");
    no_secret("token revoke", &out, &err);
    assert_eq!(out.trim(), format!("revoked {id}"));
    assert_eq!(s(&g.show(&id), "state"), "revoked");
}

#[test]
fn a_second_signal_stops_the_scratch_servers_before_exiting() {
    let mut g = Gateway::start(Some(SMALL_GOLDEN), Some("shutdown_grace = \"5m\"\n"));
    let t = g.issue("double-ctrl-c", 600);
    let id = s(&t, "id");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    // An open session keeps the graceful shutdown waiting for the whole grace.
    let client = rt.block_on(async {
        let c = harness::connect(&s(&t, "dsn")).await.expect("connect");
        c.simple_query("select 1").await.expect("query");
        c
    });
    let (pm, _) = harness::postmaster(&g, &id).expect("token's postmaster");
    assert!(pid_alive(pm));
    let mut child = g.child.take().expect("child");
    let pid = child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGINT) };
    assert!(
        wait_until(Duration::from_secs(60), || g
            .log()
            .contains("waiting for open sessions")),
        "{}",
        g.log()
    );
    assert!(pid_alive(pm), "the first signal waits for the session");
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = wait_exit(&mut child, Duration::from_secs(60)).expect("exited");
    assert_eq!(status.code(), Some(130), "{}", g.log());
    assert!(
        wait_until(Duration::from_secs(10), || !pid_alive(pm)),
        "the scratch server outlived the gateway"
    );
    assert!(
        wait_until(Duration::from_secs(10), || harness::processes_in(
            &g.data_dir
        )
        .is_empty()),
        "processes left: {:?}",
        harness::processes_in(&g.data_dir)
    );
    let log = g.log();
    assert!(
        log.contains("second signal; stopping the scratch Postgres servers"),
        "{log}"
    );
    assert!(
        log.contains("sandpit: stopped ") && !log.contains("sandpit: stopped 0 "),
        "{log}"
    );
    drop(client);
}

/// A superuser token is for the microvm provider only: on `instance` (a host process per
/// token) both the API and the CLI refuse it, say why, and no token is made. Ordinary
/// tokens show `superuser: false`.
#[test]
fn a_superuser_token_is_refused_by_the_instance_provider() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let (status, v) = g.raw_call(
        "POST",
        "/v1/tokens",
        Some(serde_json::json!({"task": "su", "ttl_seconds": 600, "superuser": true})),
    );
    assert_eq!(status, 400, "{v}");
    let msg = s(&v, "error");
    assert!(msg.contains("microvm") && msg.contains("instance"), "{msg}");
    let env = [
        ("SANDPIT_API", g.api.as_str()),
        ("SANDPIT_ADMIN_KEY", g.admin_key.as_str()),
    ];
    let (code, out, err) =
        run_sandpit(&["token", "issue", "--task", "su-cli", "--superuser"], &env);
    assert_ne!(code, 0, "{out}");
    assert!(out.trim().is_empty(), "no DSN printed: {out}");
    assert!(err.contains("microvm"), "{err}");
    let (_, list) = g.raw_call("GET", "/v1/tokens", None);
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");

    let t = g.issue("plain", 600);
    assert_eq!(t["superuser"], Value::Bool(false), "{t}");
    let (code, out, err) = run_sandpit(&["token", "show", &s(&t, "id")], &env);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("superuser") && l.trim_end().ends_with("false")),
        "{out}"
    );
}
