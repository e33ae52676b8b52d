//! libpq connection strings, parsed the way libpq parses them (`postgresql://` URIs and
//! `key=value` lists), so that a source DSN reaches `pg_dump` with every parameter as given
//! (`sslmode=verify-full`, `sslrootcert=…`, `target_session_attrs=…`) while its password
//! travels apart from the rest.

/// Why a connection string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConninfoError(String);

fn err(msg: impl Into<String>) -> ConninfoError {
    ConninfoError(msg.into())
}

/// Keyword/value pairs in the order given (libpq lets a later one win).
pub type Params = Vec<(String, String)>;

/// Parses either form, like libpq's `PQconninfoParse`.
pub fn parse(s: &str) -> Result<Params, ConninfoError> {
    let params = match ["postgresql://", "postgres://"]
        .iter()
        .find_map(|p| s.strip_prefix(p))
    {
        Some(rest) => parse_uri(rest)?,
        None => parse_key_values(s)?,
    };
    for (k, _) in &params {
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(err(format!("invalid connection option \"{k}\"")));
        }
    }
    Ok(params)
}

/// The last value of `key`.
pub fn get<'a>(params: &'a Params, key: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `key='value' …`, quoted so libpq reads back exactly `params`.
pub fn render(params: &Params) -> String {
    params
        .iter()
        .map(|(k, v)| {
            let mut q = String::with_capacity(v.len() + 2);
            for c in v.chars() {
                if c == '\'' || c == '\\' {
                    q.push('\\');
                }
                q.push(c);
            }
            format!("{k}='{q}'")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// libpq's `isspace()` (the C locale's).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// `key = value key2='quoted \' value'`: unquoted values end at whitespace, a backslash
/// escapes the next character in both forms.
fn parse_key_values(s: &str) -> Result<Params, ConninfoError> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    loop {
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        if i == b.len() {
            return Ok(out);
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !is_space(b[i]) {
            i += 1;
        }
        let key = &s[start..i];
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        if i == b.len() || b[i] != b'=' {
            return Err(err(format!(
                "missing \"=\" after \"{key}\" in connection info string"
            )));
        }
        i += 1;
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        let mut val = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            loop {
                match b.get(i) {
                    None => {
                        return Err(err("unterminated quoted string in connection info string"))
                    }
                    Some(b'\\') => {
                        if let Some(&c) = b.get(i + 1) {
                            val.push(c);
                        }
                        i += 2;
                    }
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(&c) => {
                        val.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !is_space(b[i]) {
                if b[i] == b'\\' {
                    if let Some(&c) = b.get(i + 1) {
                        val.push(c);
                    }
                    i += 2;
                } else {
                    val.push(b[i]);
                    i += 1;
                }
            }
        }
        let val = String::from_utf8(val).map_err(|_| err("connection info is not UTF-8"))?;
        out.push((key.to_string(), val));
    }
}

/// `[user[:password]@][host[:port][,…]][/dbname][?key=value&…]`, percent-decoded.
fn parse_uri(rest: &str) -> Result<Params, ConninfoError> {
    let mut out = Vec::new();
    let mut p = rest;
    // Credentials, if an '@' comes before any '/'.
    if let Some(at) = p.find(['@', '/']).filter(|&i| p.as_bytes()[i] == b'@') {
        let creds = &p[..at];
        let (user, password) = match creds.find(':') {
            Some(c) => (&creds[..c], Some(&creds[c + 1..])),
            None => (creds, None),
        };
        if !user.is_empty() {
            out.push(("user".to_string(), decode(user)?));
        }
        if let Some(pw) = password {
            out.push(("password".to_string(), decode(pw)?));
        }
        p = &p[at + 1..];
    }
    // Hosts and ports, comma-separated; an IPv6 address in brackets.
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    let mut any_port = false;
    loop {
        let (host, after) = if let Some(inner) = p.strip_prefix('[') {
            let close = inner
                .find(']')
                .ok_or_else(|| err("missing \"]\" in IPv6 host address in URI"))?;
            if close == 0 {
                return Err(err("IPv6 host address may not be empty in URI"));
            }
            let after = &inner[close + 1..];
            if !after.is_empty() && !after.starts_with([':', '/', '?', ',']) {
                return Err(err("unexpected character after IPv6 host address in URI"));
            }
            (&inner[..close], after)
        } else {
            let end = p.find([':', '/', '?', ',']).unwrap_or(p.len());
            (&p[..end], &p[end..])
        };
        hosts.push(host);
        p = after;
        if let Some(r) = p.strip_prefix(':') {
            let end = r.find(['/', '?', ',']).unwrap_or(r.len());
            ports.push(&r[..end]);
            any_port = true;
            p = &r[end..];
        } else {
            ports.push("");
        }
        match p.strip_prefix(',') {
            Some(r) => p = r,
            None => break,
        }
    }
    let host_list = hosts.join(",");
    if !host_list.is_empty() {
        out.push(("host".to_string(), decode(&host_list)?));
    }
    if any_port {
        out.push(("port".to_string(), decode(&ports.join(","))?));
    }
    if let Some(r) = p.strip_prefix('/') {
        let end = r.find('?').unwrap_or(r.len());
        if end > 0 {
            out.push(("dbname".to_string(), decode(&r[..end])?));
        }
        p = &r[end..];
    }
    if let Some(query) = p.strip_prefix('?') {
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                err(format!(
                    "missing key/value separator \"=\" in URI query parameter: \"{pair}\""
                ))
            })?;
            if v.contains('=') {
                return Err(err(format!(
                    "extra key/value separator \"=\" in URI query parameter: \"{pair}\""
                )));
            }
            let (k, v) = (decode(k)?, decode(v)?);
            // libpq's one alias, kept for JDBC-style URIs.
            if k == "ssl" && v == "true" {
                out.push(("sslmode".to_string(), "require".to_string()));
            } else {
                out.push((k, v));
            }
        }
    }
    Ok(out)
}

/// Percent-decoding as libpq does it: `%XX` only, never `%00`.
fn decode(s: &str) -> Result<String, ConninfoError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| err(format!("invalid percent-encoded token: \"{s}\"")))?;
            if hex == 0 {
                return Err(err(format!(
                    "forbidden value %00 in percent-encoded value: \"{s}\""
                )));
            }
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| err("connection info is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Params {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_like_libpq() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            (
                "postgresql://alice:s%40cret@db.example:5433/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem",
                &[
                    ("user", "alice"),
                    ("password", "s@cret"),
                    ("host", "db.example"),
                    ("port", "5433"),
                    ("dbname", "shop"),
                    ("sslmode", "verify-full"),
                    ("sslrootcert", "/etc/ca.pem"),
                ],
            ),
            ("postgres://h", &[("host", "h")]),
            (
                "postgresql://[::1]:5,h2/db",
                &[("host", "::1,h2"), ("port", "5,"), ("dbname", "db")],
            ),
            (
                "postgresql://u@h?ssl=true&application_name=a%20b",
                &[
                    ("user", "u"),
                    ("host", "h"),
                    ("sslmode", "require"),
                    ("application_name", "a b"),
                ],
            ),
            (
                "postgresql:///db?host=/tmp/sock",
                &[("dbname", "db"), ("host", "/tmp/sock")],
            ),
            (
                "host=h port = 5 password='it\\'s a \\\\ secret' sslmode=verify-ca dbname=a\\ b",
                &[
                    ("host", "h"),
                    ("port", "5"),
                    ("password", "it's a \\ secret"),
                    ("sslmode", "verify-ca"),
                    ("dbname", "a b"),
                ],
            ),
            ("  ", &[]),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input).as_ref(), Ok(&kv(want)), "{input}");
        }
    }

    #[test]
    fn refuses_what_libpq_refuses() {
        for bad in [
            "host",
            "host=h port",
            "password='open",
            "postgresql://[::1",
            "postgresql://[]/db",
            "postgresql://h/db?a",
            "postgresql://h/db?a=b=c",
            "postgresql://h/%zz",
            "postgresql://h/a%00",
            "Host=h",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn render_reads_back_the_same_pairs() {
        let p = kv(&[
            ("host", "h"),
            ("dbname", "a b'c\\d"),
            ("sslrootcert", "/x y/ca.pem"),
            ("options", ""),
        ]);
        let text = render(&p);
        assert_eq!(parse(&text), Ok(p));
        assert_eq!(get(&parse(&text).unwrap(), "dbname"), Some("a b'c\\d"));
    }
}
