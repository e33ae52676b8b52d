//! Which startup parameters may reach the backend. Everything a client may set for its own
//! session (`application_name`, `client_encoding`, `options=-c statement_timeout=…`) is
//! relayed; settings that change the session's identity are refused before any backend is
//! touched.
//!
//! `options` is parsed the way the server parses it (split on unescaped whitespace, a
//! backslash escapes the next byte, then getopt-style switches), but conservatively: any
//! `name=value` that the server could read as a setting is checked, whichever switch form
//! carries it (`-c name=value`, `-cname=value`, a bundle like `-Pcname=value`,
//! `--name=value`), with names compared the server's way (case-insensitive, `-` read as `_`).

use crate::wire::startup::StartupMessage;

/// Settings a client may never choose: they would change who the session runs as.
const FORBIDDEN: &[&str] = &["role", "session_authorization"];

/// Server switches that take an argument (PostgreSQL's `process_postgres_switches`).
const SWITCHES_WITH_ARG: &[u8] = b"BCDdfhkNprStvWc";

/// The reason a startup packet is refused, or None when its settings may pass.
pub fn forbidden(m: &StartupMessage) -> Option<String> {
    for (k, v) in &m.params {
        if let Some(bad) = forbidden_name(k) {
            return Some(format!(
                "startup parameter \"{bad}\" is not allowed through sandpit"
            ));
        }
        if k.eq_ignore_ascii_case("options") {
            let text = String::from_utf8_lossy(v);
            if let Some(bad) = forbidden_in_options(&text) {
                return Some(format!(
                    "setting \"{bad}\" in startup options is not allowed through sandpit"
                ));
            }
        }
    }
    None
}

/// The forbidden setting `name` stands for, if any (`ROLE`, `session-authorization`, …).
fn forbidden_name(name: &str) -> Option<&'static str> {
    let norm: String = name
        .trim()
        .chars()
        .map(|c| {
            if c == '-' {
                '_'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    FORBIDDEN.iter().copied().find(|f| *f == norm)
}

/// Split like the server's `pg_split_opts`: unescaped whitespace separates, `\x` is `x`.
fn split_options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    let mut in_token = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
            in_token = true;
        } else if c.is_ascii_whitespace() {
            if in_token {
                out.push(std::mem::take(&mut cur));
                in_token = false;
            }
        } else {
            cur.push(c);
            in_token = true;
        }
    }
    if in_token {
        out.push(cur);
    }
    out
}

/// The first forbidden setting found in an `options` value.
fn forbidden_in_options(options: &str) -> Option<&'static str> {
    let tokens = split_options(options);
    let check = |arg: &str| forbidden_name(arg.split('=').next().unwrap_or(arg));
    for (i, tok) in tokens.iter().enumerate() {
        // Any token shaped like a setting: covers the argument of `-c name=value` wherever
        // getopt would find it (glibc permutes, so position does not matter).
        if tok.contains('=') {
            if let Some(bad) = check(tok.trim_start_matches('-')) {
                return Some(bad);
            }
        }
        if let Some(long) = tok.strip_prefix("--") {
            if let Some(bad) = check(long) {
                return Some(bad);
            }
            continue;
        }
        let Some(bundle) = tok.strip_prefix('-') else {
            continue;
        };
        // A bundle of switches: each one with an argument ends the bundle; `c`'s argument is
        // the rest of the token or the next token.
        for (pos, b) in bundle.bytes().enumerate() {
            if !SWITCHES_WITH_ARG.contains(&b) {
                continue;
            }
            if b == b'c' {
                let rest = &bundle[pos + 1..];
                let arg = if rest.is_empty() {
                    tokens.get(i + 1).map(String::as_str).unwrap_or("")
                } else {
                    rest
                };
                if let Some(bad) = check(arg) {
                    return Some(bad);
                }
            }
            // Conservative: a `c` later in another switch's argument is checked too.
            if let Some(bad) = bundle[pos + 1..]
                .match_indices('c')
                .find_map(|(j, _)| check(&bundle[pos + 1 + j + 1..]))
            {
                return Some(bad);
            }
            break;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(params: &[(&str, &[u8])]) -> StartupMessage {
        StartupMessage {
            major: 3,
            minor: 0,
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
        }
    }

    fn opts(v: &str) -> Option<String> {
        forbidden(&msg(&[("user", b"u"), ("options", v.as_bytes())]))
    }

    #[test]
    fn refuses_role_settings_in_every_form() {
        for bad in [
            "-c role=postgres",
            "-crole=postgres",
            "-c ROLE=postgres",
            "-c session_authorization=postgres",
            "-c session-authorization=postgres",
            "--role=postgres",
            "--session-authorization=postgres",
            "--Session_Authorization=x",
            "-c statement_timeout=5s -c role=x",
            "-Pc role=x",
            "-Pcrole=x",
            "  -c\trole=x  ",
            "-c\\ role=x",
            "-c r\\ole=x",
            "x -c role=x",
        ] {
            assert!(opts(bad).is_some(), "{bad:?} was let through");
        }
        for key in [
            "role",
            "ROLE",
            "session_authorization",
            "session-authorization",
        ] {
            assert!(
                forbidden(&msg(&[(key, b"postgres")])).is_some(),
                "{key} as a startup parameter"
            );
        }
    }

    #[test]
    fn lets_ordinary_settings_through() {
        for ok in [
            "",
            "-c statement_timeout=5s",
            "-cstatement_timeout=5s",
            "--statement-timeout=5s",
            "-c search_path=public,pg_catalog -c application_name=x",
            "-c work_mem=64MB",
            "-c default_transaction_read_only=on",
            "-c rolex=1",
            "-c my.role_name=x",
        ] {
            assert_eq!(opts(ok), None, "{ok:?} was refused");
        }
        let m = msg(&[
            ("user", b"u"),
            ("application_name", b"caf\xe9"),
            ("client_encoding", b"LATIN1"),
        ]);
        assert_eq!(forbidden(&m), None);
    }

    #[test]
    fn splits_like_the_server() {
        assert_eq!(
            split_options(r" -c  a=b\ c -c\\d "),
            vec!["-c", "a=b c", r"-c\d"]
        );
        assert!(split_options("   ").is_empty());
    }
}
