//! The gateway's statement splitter against the real Postgres grammar (libpg_query through
//! the `pg_query` crate). Only in the fuzz crate: the main crate never links libpg_query.
//!
//! The server parses a whole simple Query before it runs any of it, so when the grammar
//! rejects the text nothing runs and no split can under-count. When it accepts the text,
//! the gateway must not find fewer statements than the server will run (it would treat
//! several results as one statement's); giving up (`None`) is allowed: the text is then
//! relayed whole and capped result by result from the backend's stream.

use sandpit::journal::classify;

/// How the gateway's split compares with the server's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The server would reject the text (nothing runs), or it is not valid UTF-8 / has NUL.
    ServerRejects,
    /// The gateway gave up: the text is relayed whole.
    GatewayGaveUp,
    /// Same statements (compared trimmed).
    Same,
    /// The gateway found more statements (each piece then fails at Parse: safe).
    GatewayMore { gateway: usize, server: usize },
    /// Same count, different boundaries.
    Boundaries { gateway: usize },
    /// The gateway found fewer statements than the server will run: a finding.
    GatewayFewer { gateway: usize, server: usize },
}

/// Compare the two splits of `text`.
pub fn compare(text: &str) -> Verdict {
    if text.contains('\0') {
        return Verdict::ServerRejects;
    }
    let Ok(server) = pg_query::split_with_parser(text) else {
        return Verdict::ServerRejects;
    };
    // libpg_query keeps comment-only and empty statements out, as the server does.
    let server: Vec<&str> = server
        .iter()
        .map(|s| s.trim_matches(pg_space))
        .filter(|s| !s.is_empty())
        .collect();
    let Some(gateway) = classify::split(text) else {
        return Verdict::GatewayGaveUp;
    };
    let (g, s) = (gateway.len(), server.len());
    if g < s {
        return Verdict::GatewayFewer {
            gateway: g,
            server: s,
        };
    }
    if g > s {
        return Verdict::GatewayMore {
            gateway: g,
            server: s,
        };
    }
    let same = gateway
        .iter()
        .zip(&server)
        .all(|(a, b)| a.trim_matches(pg_space) == *b);
    if same {
        Verdict::Same
    } else {
        Verdict::Boundaries { gateway: g }
    }
}

/// Whitespace as the Postgres lexer sees it (`\v` included).
fn pg_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// The fuzz target: panics when the gateway under-counts a text the server accepts.
pub fn split_differential(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Verdict::GatewayFewer { gateway, server } = compare(text) {
        panic!("the gateway split {text:?} into {gateway} statements, the server into {server}");
    }
}
