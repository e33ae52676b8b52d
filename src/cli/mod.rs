//! The CLI's client side: token commands call the control API over HTTP.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

pub mod args;
mod text;
pub use text::*;

/// A CLI failure, printed by the binary.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("no admin key: set SANDPIT_ADMIN_KEY, admin_key in the config, or run where <data dir>/admin.key exists")]
    NoAdminKey,
    #[error("cannot reach the sandpit API at {api}: {message}")]
    Unreachable { api: String, message: String },
    #[error("API error {status}: {message}")]
    Api { status: u16, message: String },
    #[error("bad argument: {0}")]
    BadArgument(String),
}

/// A success answer whose body could not be read.
fn unreadable<T>(r: reqwest::Result<T>) -> Result<T, CliError> {
    r.map_err(|e| CliError::Api {
        status: 200,
        message: e.to_string(),
    })
}

/// Statements per page read by `sandpit log`.
const LOG_PAGE: usize = 1000;

/// A client for the control API.
pub struct ApiClient {
    base: String,
    key: String,
    http: reqwest::blocking::Client,
}

/// What `token issue` asks for (the body of POST /v1/tokens); None leaves the gateway's default.
#[derive(Debug, Default)]
pub struct IssueRequest<'a> {
    pub task: &'a str,
    pub ttl: Option<Duration>,
    pub max_rows: Option<u64>,
    pub max_bytes: Option<u64>,
    pub cap_mode: Option<&'a str>,
    pub allow: Option<Vec<String>>,
    pub max_connections: Option<u32>,
    pub statement_timeout: Option<Duration>,
    pub idle_in_transaction_timeout: Option<Duration>,
    pub metadata: BTreeMap<String, String>,
    pub superuser: bool,
}

impl ApiClient {
    /// `base` like `http://127.0.0.1:6433`.
    pub fn new(base: &str, key: Option<String>) -> Result<ApiClient, CliError> {
        let key = key.ok_or(CliError::NoAdminKey)?;
        let base = base.trim_end_matches('/').to_string();
        // Long enough for a golden build from a live database, which answers when done.
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(3600))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CliError::Unreachable {
                api: base.clone(),
                message: format!("HTTP client: {e}"),
            })?;
        Ok(ApiClient { base, key, http })
    }

    /// A request to `url` with the admin key, sent; an error status is a [`CliError::Api`].
    fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<Value>,
    ) -> Result<reqwest::blocking::Response, CliError> {
        let mut req = self.http.request(method, url).bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().map_err(|e| CliError::Unreachable {
            api: self.base.clone(),
            message: e.to_string(),
        })?;
        let status = res.status();
        if status.is_success() {
            return Ok(res);
        }
        let v: Value = res.json().unwrap_or(Value::Null);
        let message = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("(no message)")
            .to_string();
        Err(CliError::Api {
            status: status.as_u16(),
            message,
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, CliError> {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|e| CliError::BadArgument(e.to_string()))?;
        let url = format!("{}{}", self.base, path);
        unreadable(self.send(method, &url, body)?.json::<Value>())
    }

    /// POST /v1/tokens.
    pub fn issue(&self, req: &IssueRequest<'_>) -> Result<Value, CliError> {
        let mut body = serde_json::json!({
            "task": req.task,
            "ttl_seconds": req.ttl.map(|d| d.as_secs().max(1)),
            "max_rows": req.max_rows,
            "max_bytes": req.max_bytes,
            "cap_mode": req.cap_mode,
            "allow": req.allow,
            "max_connections": req.max_connections,
            "statement_timeout_ms": req.statement_timeout.map(|d| d.as_millis() as u64),
            "idle_in_transaction_timeout_ms":
                req.idle_in_transaction_timeout.map(|d| d.as_millis() as u64),
            "metadata": req.metadata,
        });
        // Sent only when asked for, so an older gateway (which refuses unknown fields)
        // still issues ordinary tokens.
        if req.superuser {
            body["superuser"] = Value::Bool(true);
        }
        self.call("POST", "/v1/tokens", Some(body))
    }

    /// GET /v1/tokens.
    pub fn list(&self) -> Result<Value, CliError> {
        self.call("GET", "/v1/tokens", None)
    }

    /// GET /v1/tokens/{id}.
    pub fn show(&self, id: &str) -> Result<Value, CliError> {
        self.call("GET", &format!("/v1/tokens/{}", encode(id)), None)
    }

    /// GET /v1/tokens/{id}/statements: the first page (see [`ApiClient::each_statement`]).
    pub fn statements(&self, id: &str) -> Result<Value, CliError> {
        self.call(
            "GET",
            &format!("/v1/tokens/{}/statements", encode(id)),
            None,
        )
    }

    /// GET /v1/tokens/{id}/statements?after=…&limit=…: one page, and the `after` of the
    /// next when more may follow.
    pub fn statements_page(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<Value>, Option<u64>), CliError> {
        let url = format!(
            "{}/v1/tokens/{}/statements?after={after}&limit={limit}",
            self.base,
            encode(id)
        );
        let r = self.send(reqwest::Method::GET, &url, None)?;
        let next = r
            .headers()
            .get(crate::control::NEXT_AFTER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let page = unreadable(r.json::<Vec<Value>>())?;
        Ok((page, next))
    }

    /// Every statement of a token's log in order, a page at a time (only one page is held).
    pub fn each_statement(
        &self,
        id: &str,
        mut f: impl FnMut(&Value) -> std::ops::ControlFlow<()>,
    ) -> Result<(), CliError> {
        let mut after = 0;
        loop {
            let (page, next) = self.statements_page(id, after, LOG_PAGE)?;
            if page.iter().try_for_each(&mut f).is_break() {
                return Ok(());
            }
            match next {
                // A cursor that does not move would loop forever.
                Some(n) if n > after => after = n,
                _ => return Ok(()),
            }
        }
    }

    /// POST /v1/tokens/{id}/discard: an ended token's scratch data destroyed without a
    /// stored review.
    pub fn discard(&self, id: &str) -> Result<Value, CliError> {
        self.call(
            "POST",
            &format!("/v1/tokens/{}/discard", encode(id)),
            Some(serde_json::json!({})),
        )
    }

    /// DELETE /v1/tokens/{id}.
    pub fn revoke(&self, id: &str) -> Result<Value, CliError> {
        self.call("DELETE", &format!("/v1/tokens/{}", encode(id)), None)
    }

    /// GET /v1/tokens/{id}/diff?format=…: the review as the server rendered it (`verify`:
    /// with the patch replayed on a fresh fork of the golden).
    pub fn review(
        &self,
        id: &str,
        format: &str,
        full_scan: bool,
        verify: bool,
    ) -> Result<String, CliError> {
        let url = format!(
            "{}/v1/tokens/{}/diff?format={}{}{}",
            self.base,
            encode(id),
            encode(format),
            if full_scan { "&scan=all" } else { "" },
            if verify { "&verify=true" } else { "" }
        );
        // The whole body, however large (a patch can be big).
        unreadable(self.send(reqwest::Method::GET, &url, None)?.text())
    }

    /// POST /v1/tokens/{id}/approve or /reject with a comment.
    pub fn decide(&self, id: &str, approve: bool, comment: &str) -> Result<Value, CliError> {
        let verb = if approve { "approve" } else { "reject" };
        self.call(
            "POST",
            &format!("/v1/tokens/{}/{verb}", encode(id)),
            Some(serde_json::json!({ "comment": comment })),
        )
    }

    /// POST /v1/tokens/{id}/promote.
    pub fn promote(&self, id: &str, body: Value) -> Result<Value, CliError> {
        self.call(
            "POST",
            &format!("/v1/tokens/{}/promote", encode(id)),
            Some(body),
        )
    }

    /// GET /v1/goldens.
    pub fn goldens(&self) -> Result<Value, CliError> {
        self.call("GET", "/v1/goldens", None)
    }

    /// POST /v1/goldens: build a version from a live database.
    pub fn build_golden(&self, body: Value) -> Result<Value, CliError> {
        self.call("POST", "/v1/goldens", Some(body))
    }

    /// POST /v1/goldens/{id}/use.
    pub fn use_golden(&self, id: &str) -> Result<Value, CliError> {
        self.call("POST", &format!("/v1/goldens/{}/use", encode(id)), None)
    }

    /// POST /v1/reap: one janitor pass.
    pub fn reap(&self, dry_run: bool) -> Result<Value, CliError> {
        self.call("POST", &format!("/v1/reap?dry_run={dry_run}"), None)
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Parse a size like `1MiB`, `512k`, `1000`.
pub fn parse_size(s: &str) -> Result<u64, CliError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| CliError::BadArgument(format!("size {s:?}")))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => {
            return Err(CliError::BadArgument(format!(
                "size unit in {s:?} (use B, KiB, MiB, GiB)"
            )))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| CliError::BadArgument(format!("size {s:?} is too large")))
}

/// Parse `k=v`.
pub fn parse_meta(s: &str) -> Result<(String, String), CliError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(CliError::BadArgument(format!(
            "metadata {s:?} must be key=value"
        ))),
    }
}

/// The token id an argument names: the id itself, or a DSN (any form `token issue` prints,
/// URL or `key=value`, even one that does not parse) or whole token `<id>.<secret>` carrying
/// it. The argument is never quoted back in an error: it may hold the secret.
pub fn token_id_arg(arg: &str) -> Result<String, CliError> {
    let arg = arg.trim();
    if crate::auth::is_token_id(arg) {
        return Ok(arg.to_string());
    }
    let ids = token_ids_in(arg);
    match ids.as_slice() {
        [id] => Ok(id.clone()),
        [] => Err(CliError::BadArgument(
            "expected a token id (sp_…) or a token's DSN; the argument is neither (not shown: it may hold a secret)".into(),
        )),
        _ => Err(CliError::BadArgument(
            "the argument names more than one token id; give one token's id or DSN".into(),
        )),
    }
}

/// Whether an argument looks like a DSN or a whole token rather than a name.
pub fn looks_like_dsn(arg: &str) -> bool {
    arg.contains("://") || arg.contains('=') || arg.contains('@') || !token_ids_in(arg).is_empty()
}

/// Distinct token ids standing as whole words in `s` (a secret's base64url characters
/// around an id would make it part of a longer word).
fn token_ids_in(s: &str) -> Vec<String> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let bytes = s.as_bytes();
    let mut out: Vec<String> = Vec::new();
    for (i, _) in s.match_indices("sp_") {
        if i > 0 && word(bytes[i - 1]) {
            continue;
        }
        let end = i + 23;
        let Some(cand) = s.get(i..end) else { continue };
        if !crate::auth::is_token_id(cand) || bytes.get(end).is_some_and(|&b| word(b)) {
            continue;
        }
        if !out.iter().any(|x| x == cand) {
            out.push(cand.to_string());
        }
    }
    out
}

/// Secrets an argument or environment value may carry: a DSN's password (URL userinfo or
/// `password=`), the secret of a whole token `<id>.<secret>`, or the value itself for
/// variables that are keys. Short strings are left out: hiding them would garble text.
pub fn secrets_in(value: &str, whole_is_secret: bool) -> Vec<String> {
    const SHORTEST: usize = 6;
    let mut out = Vec::new();
    if whole_is_secret {
        out.push(value.to_string());
    }
    if let Some(rest) = value.split_once("://").map(|x| x.1) {
        // The userinfo ends at an '@' (a password may hold one only percent-encoded; be
        // generous and try the last one too).
        for at in [rest.find('@'), rest.rfind('@')].into_iter().flatten() {
            if let Some((_, pw)) = rest[..at].split_once(':') {
                out.push(pw.to_string());
                if let Ok(decoded) = percent_decode(pw) {
                    out.push(decoded);
                }
            }
        }
    }
    for (i, _) in value.match_indices("password=") {
        let v = &value[i + "password=".len()..];
        let v = match v.strip_prefix('\'') {
            Some(q) => q.split('\'').next().unwrap_or(q),
            None => v.split([' ', '&', '\t', '\n']).next().unwrap_or(v),
        };
        out.push(v.to_string());
    }
    for id in token_ids_in(value) {
        for (i, _) in value.match_indices(&format!("{id}.")) {
            let after = &value[i + id.len() + 1..];
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(after.len());
            out.push(after[..end].to_string());
        }
    }
    out.retain(|s| s.len() >= SHORTEST);
    out
}

fn percent_decode(s: &str) -> Result<String, ()> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or(())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ())?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ())
}

/// Secrets the command line and environment of this process hold (DSN passwords, whole
/// tokens, keys), so that no error the CLI prints ever repeats one.
pub fn secrets_of_invocation() -> Vec<String> {
    let mut out: Vec<String> = std::env::args()
        .skip(1)
        .flat_map(|a| secrets_in(&a, false))
        .collect();
    for (var, whole) in [
        ("SANDPIT_DSN", false),
        ("SANDPIT_GOLDEN_SOURCE_DSN", false),
        ("SANDPIT_API", false),
        ("SANDPIT_ADMIN_KEY", true),
        ("SANDPIT_REMOTE_API_KEY", true),
    ] {
        if let Ok(v) = std::env::var(var) {
            out.extend(secrets_in(&v, whole));
        }
    }
    out
}

/// `text` with every one of `secrets` replaced by `***` (longest first, so a secret that
/// contains another is hidden whole).
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut sorted: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for s in sorted {
        out = out.replace(s.as_str(), "***");
    }
    out
}

#[cfg(test)]
mod tests;
