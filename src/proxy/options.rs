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
            if let Some(b) = v.iter().find(|b| is_control(**b)) {
                return Some(format!(
                    "startup options contain the control byte 0x{b:02x}, which is not allowed through sandpit"
                ));
            }
            if let Some(bad) = forbidden_in_options(v) {
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

/// The server's `isspace()` in `pg_split_opts` (glibc classifies no byte above 0x7f as
/// space in any locale): space, `\t`, `\n`, `\v`, `\f`, `\r`.
fn is_pg_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Control bytes other than the separators: refused outright, so nothing the server might
/// read differently from us gets through.
fn is_control(b: u8) -> bool {
    (b < 0x20 || b == 0x7f) && !is_pg_space(b)
}

/// Split like the server's `pg_split_opts`: unescaped whitespace separates, `\x` is `x`.
fn split_options(s: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut escaped = false;
    let mut in_token = false;
    for &b in s {
        if escaped {
            cur.push(b);
            escaped = false;
        } else if b == b'\\' {
            escaped = true;
            in_token = true;
        } else if is_pg_space(b) {
            if in_token {
                out.push(String::from_utf8_lossy(&std::mem::take(&mut cur)).into_owned());
                in_token = false;
            }
        } else {
            cur.push(b);
            in_token = true;
        }
    }
    if in_token {
        out.push(String::from_utf8_lossy(&cur).into_owned());
    }
    out
}

/// The first forbidden setting found in an `options` value.
fn forbidden_in_options(options: &[u8]) -> Option<&'static str> {
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
        let cases: &[(&[u8], &[&str])] = &[
            (br" -c  a=b\ c -c\\d ", &["-c", "a=b c", r"-c\d"]),
            (b"   ", &[]),
            (b"", &[]),
            // Every byte the server's isspace() accepts separates.
            (
                b"a b\tc\nd\x0be\x0cf\rg",
                &["a", "b", "c", "d", "e", "f", "g"],
            ),
            (b"\x0b-crole=x", &["-crole=x"]),
            // A backslash escapes any of them, and itself.
            (b"a\\\x0bb", &["a\x0bb"]),
            (br"a\\ b", &[r"a\", "b"]),
            // A trailing backslash still makes a token (as pg_split_opts does).
            (br"\", &[""]),
            // Bytes above 0x7f are not whitespace.
            (b"a\xa0b \x85c", &["a\u{fffd}b", "\u{fffd}c"]),
        ];
        for (input, want) in cases {
            assert_eq!(
                &split_options(input),
                want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn vertical_tab_and_control_bytes_cannot_hide_a_setting() {
        let cases: &[(&[u8], bool)] = &[
            (b"\x0b-crole=postgres", true),
            (b"-c\x0brole=postgres", true),
            (b"-c\x0crole=postgres", true),
            (b"-c\rrole=postgres", true),
            (b"\x01-crole=postgres", true),
            (b"-c statement_timeout=5s\x00", true),
            (b"-c application_name=a\x1bb", true),
            (b"-c application_name=a\x7fb", true),
            (b"-c\x0bstatement_timeout=5s", false),
            (b"-c\tstatement_timeout=5s\n", false),
        ];
        for (v, refused) in cases {
            let got = forbidden(&msg(&[("user", b"u"), ("options", v)]));
            assert_eq!(got.is_some(), *refused, "{v:?}: {got:?}");
        }
        let got = forbidden(&msg(&[("options", b"\x01")])).expect("refused");
        assert!(got.contains("control byte 0x01"), "{got}");
    }
}
