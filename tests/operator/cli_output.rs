//! What the CLI writes for a person: errors as one line with their causes and never a
//! backtrace (even with RUST_BACKTRACE=1), a closed stdout (`sandpit log … | head`) ending it
//! quietly with 0, and `token list` columns that line up whatever the task names.

use crate::support::harness;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::support::harness::{run_sandpit, Gateway, SMALL_GOLDEN};

#[test]
fn cli_errors_are_one_line_with_causes_and_no_backtrace() {
    // Nothing listens on port 1: the error has causes (the request, the connection).
    let backtrace = [
        ("RUST_BACKTRACE", "1"),
        ("RUST_LIB_BACKTRACE", "1"),
        ("SANDPIT_API", "http://127.0.0.1:1"),
        ("SANDPIT_ADMIN_KEY", "k"),
    ];
    for args in [
        &["token", "list"][..],
        &["token", "show", "sp_abcdefghijklmnopqrst"],
        &["--config", "/nonexistent/sandpit.toml", "token", "list"],
    ] {
        let (code, out, err) = run_sandpit(args, &backtrace);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line expected:\n{err}");
        assert!(lines[0].starts_with("Error: "), "{err}");
        for noise in ["backtrace", "Caused by", "panicked", " at src/"] {
            assert!(!err.contains(noise), "{args:?} printed {noise:?}:\n{err}");
        }
    }
    // The causes are there, on that line.
    let (_, _, err) = run_sandpit(&["token", "list"], &backtrace);
    assert!(err.matches(": ").count() >= 2, "{err}");
}

#[test]
fn a_closed_stdout_ends_the_cli_quietly_and_token_list_lines_up() {
    let g = Gateway::start(Some(SMALL_GOLDEN), None);
    let t = g.issue("pipe", 600);
    let dsn = t["dsn"].as_str().expect("dsn");
    // 3000 statements: a log far longer than a pipe's buffer, so the CLI is still writing
    // when the reader goes away.
    let tmp = harness::tempdir();
    let script = tmp.path().join("many.sql");
    let sql: String = (0..3000).map(|i| format!("select {i} as n;\n")).collect();
    std::fs::write(&script, sql).expect("write script");
    let (ok, _, err) = harness::psql(
        dsn,
        &["-q", "-o", "/dev/null", "-f", &script.to_string_lossy()],
    );
    assert!(ok, "{err}");

    let env = [
        ("SANDPIT_API", g.api.as_str()),
        ("SANDPIT_ADMIN_KEY", g.admin_key.as_str()),
    ];
    for args in [&["log", "pipe"][..], &["log", "pipe", "--json"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandpit"))
            .args(args)
            .envs(env)
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run sandpit log");
        // Like `| head -1`: read one line, then close the pipe.
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut first)
            .expect("first line");
        assert!(!first.is_empty());
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.trim().is_empty(), "{args:?} wrote to stderr:\n{err}");
    }
    // The whole log, read to the end, is still all there.
    let (code, out, err) = run_sandpit(&["log", "pipe"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() >= 3000, "{}", out.lines().count());

    // token list: task names of very different lengths, columns still line up.
    g.issue("a", 600);
    g.issue("a-task-name-much-longer-than-twenty-four-characters", 600);
    let (code, out, err) = run_sandpit(&["token", "list"], &env);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for col in ["STATE", "TASK", "EXPIRES", "SESSIONS"] {
        let at = lines[0].find(col).expect("column");
        for row in &lines[1..] {
            assert_eq!(&row[at - 2..at], "  ", "{col}:\n{out}");
            assert_ne!(row.as_bytes()[at], b' ', "{col}:\n{out}");
        }
    }
}
