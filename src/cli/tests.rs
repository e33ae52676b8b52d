//! Tests of `cli`.
use super::*;

#[test]
fn token_id_from_id_dsn_or_whole_token_and_no_echo() {
    let id = crate::auth::new_token_id();
    let secret = crate::auth::new_secret();
    for arg in [
        id.clone(),
        format!("postgresql://{id}:{secret}@127.0.0.1:6432/sandpit"),
        format!("postgresql://agent:{id}.{secret}@127.0.0.1:6432/sandpit?sslmode=require"),
        format!("host=127.0.0.1 port=6432 user={id} password={secret} dbname=sandpit"),
        format!("{id}.{secret}"),
        // Unparsable (bad port), still names the token.
        format!("postgresql://{id}:{secret}@127.0.0.1:notaport/sandpit"),
        format!("  {id}\n"),
    ] {
        assert_eq!(token_id_arg(&arg).unwrap(), id, "{arg}");
    }
    for bad in [
        format!("postgresql://agent:{secret}@127.0.0.1:6432/sandpit"),
        "sp_short".to_string(),
        format!("x{id}"),
    ] {
        let e = token_id_arg(&bad).unwrap_err().to_string();
        assert!(!e.contains(&secret) && !e.contains(&bad), "{e}");
    }
    let other = crate::auth::new_token_id();
    assert!(token_id_arg(&format!("{id} {other}")).is_err());
    assert!(looks_like_dsn(&format!("postgresql://{id}:{secret}@h/db")));
    assert!(!looks_like_dsn("reconcile-refunds"));
}

#[test]
fn secrets_found_in_every_dsn_form_and_redacted() {
    let id = crate::auth::new_token_id();
    let secret = crate::auth::new_secret();
    let forms = [
        format!("postgresql://{id}:{secret}@127.0.0.1:6432/sandpit"),
        format!("postgresql://agent:{id}.{secret}@h:notaport/db"),
        format!("user={id} password={secret} host=h"),
        format!("user={id} password='{secret}' host=h"),
        format!("{id}.{secret}"),
    ];
    for f in &forms {
        let found = secrets_in(f, false);
        let msg = format!("error: bad thing with {f} and {secret}");
        let red = redact(&msg, &found);
        assert!(!red.contains(&secret), "{f}: {red}");
        assert!(red.contains("***"), "{red}");
    }
    // Percent-encoded passwords are hidden in both spellings.
    let found = secrets_in("postgresql://u:p%40ss%2Fword@h/db", false);
    assert!(found.contains(&"p@ss/word".to_string()), "{found:?}");
    assert_eq!(secrets_in("abcdefgh", true), vec!["abcdefgh".to_string()]);
    assert!(secrets_in("reconcile-refunds", false).is_empty());
}

#[test]
fn token_table_columns_line_up_whatever_the_cell_lengths() {
    let v = serde_json::json!({"id": "sp_abcdefghijklmnopqrst", "state": "live",
        "task": "t", "expires_at": "2026-01-01T00:00:00Z", "sessions": 2});
    let long = serde_json::json!({"id": "sp_x", "state": "revoked",
        "task": "a-task-name-longer-than-any-fixed-column-would-be", "expires_at": null,
        "sessions": 12345, "review": "failed: lock\ntimeout"});
    let table = token_table(&[v.clone(), long]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let h = lines[0];
    for row in &lines[1..] {
        for col in ["STATE", "TASK", "EXPIRES", "SESSIONS", "REVIEW"] {
            let at = h.find(col).unwrap();
            assert_ne!(row.as_bytes()[at], b' ', "{col}:\n{table}");
            assert_eq!(&row[at - 2..at], "  ", "{col}:\n{table}");
        }
    }
    assert!(
        lines[2].ends_with("12345     review failed: lock\\u{a}timeout")
            && lines[2].contains("  -  "),
        "{table}"
    );
    assert!(lines[1].ends_with("  -"), "{table}");
    assert_eq!(
        token_table(&[]),
        "ID  STATE  TASK  EXPIRES  SESSIONS  REVIEW"
    );
    let text = token_text(&v);
    assert!(
        text.lines()
            .any(|l| l.starts_with("state") && l.ends_with("live")),
        "{text}"
    );
}

#[test]
fn sizes_and_meta() {
    assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
    assert_eq!(parse_size("512k").unwrap(), 512 * 1024);
    assert_eq!(parse_size("42").unwrap(), 42);
    assert!(parse_size("12 parsecs").is_err());
    assert_eq!(parse_meta("a=b=c").unwrap(), ("a".into(), "b=c".into()));
    assert!(parse_meta("=x").is_err());
}
