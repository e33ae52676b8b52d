//! `review_changes`: what the agent changed in its scratch database, against the golden —
//! the same review the harness reads at `GET /v1/tokens/{id}/diff`, as text. Inside the
//! gateway (HTTP) it is taken directly; from `sandpit mcp` (stdio, a separate process that
//! holds only the token) it is asked of the gateway's `POST /mcp` with the token as bearer,
//! so no admin key is ever needed on the agent's side.

use std::sync::Arc;

use serde_json::{json, Value};

use super::sql::Outcome;
use crate::lifecycle::Gateway;
use crate::review::reviewer::Reviewer;
use crate::review::store::{self, Format};

/// Longest review text handed to the model; the rest is cut with a note.
pub const MAX_REVIEW_TEXT: usize = 64 * 1024;

/// Where a review comes from.
pub enum ReviewSource {
    /// In the gateway process: take it from the registry and provider directly.
    InProcess {
        /// The gateway.
        gw: Arc<Gateway>,
        /// The token the MCP server is bound to.
        token: String,
    },
    /// From another process: `tools/call review_changes` on the gateway's `POST /mcp`.
    Remote {
        /// URL of the gateway's `/mcp` endpoint.
        url: String,
        /// The whole token, `<id>.<secret>`.
        bearer: String,
    },
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_REVIEW_TEXT {
        let mut end = MAX_REVIEW_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("\n… (review cut at 64 KiB; the harness has the whole of it)\n");
    }
    text
}

fn failed(text: String) -> Outcome {
    Outcome {
        text,
        is_error: true,
    }
}

impl ReviewSource {
    /// The review as text.
    pub async fn changes(&self) -> Outcome {
        match self {
            ReviewSource::InProcess { gw, token } => {
                // Read afresh: the token's backend may have been forked since the request began.
                let Some(rec) = gw.registry.get(token) else {
                    return failed(format!("unknown token {token}"));
                };
                let reviewer = Reviewer::new(&gw.config, gw.provider.clone(), gw.gateway_id());
                gw.logs.flush(token);
                match store::take(&reviewer, &rec, false).await {
                    Ok(review) => Outcome {
                        text: cut(store::render(&review, &[], Format::Text)),
                        is_error: false,
                    },
                    Err(e) => {
                        tracing::warn!(token = %token, error = %e, "mcp review failed");
                        failed(
                            "the review could not be taken (details are in the gateway log)".into(),
                        )
                    }
                }
            }
            ReviewSource::Remote { url, bearer } => remote(url, bearer).await,
        }
    }
}

async fn remote(url: &str, bearer: &str) -> Outcome {
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "review_changes", "arguments": {}}});
    let client = match reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(300))
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => return failed(format!("review request failed: {e}")),
    };
    let res = client.post(url).bearer_auth(bearer).json(&req).send().await;
    let v: Value = match res {
        Ok(r) if !r.status().is_success() => {
            let s = r.status().as_u16();
            return failed(format!("the gateway refused the review request (HTTP {s})"));
        }
        Ok(r) => match r.json().await {
            Ok(v) => v,
            Err(e) => return failed(format!("review answer unreadable: {e}")),
        },
        Err(e) => return failed(format!("cannot reach the gateway API at {url}: {e}")),
    };
    let result = &v["result"];
    match result["content"][0]["text"].as_str() {
        Some(t) => Outcome {
            text: cut(t.to_string()),
            is_error: result["isError"].as_bool().unwrap_or(false),
        },
        None => failed(format!(
            "review failed: {}",
            v["error"]["message"].as_str().unwrap_or("no result")
        )),
    }
}

/// The whole token `<id>.<secret>` a DSN carries: user = token id and password = secret (as
/// `token issue` prints it), or any user with the whole token as password.
pub fn full_token_of_dsn(dsn: &str) -> Option<String> {
    let cfg: tokio_postgres::Config = dsn.parse().ok()?;
    let password = std::str::from_utf8(cfg.get_password()?).ok()?;
    if crate::auth::parse_full_token(password).is_some() {
        return Some(password.to_string());
    }
    let user = cfg.get_user()?;
    let whole = format!("{user}.{password}");
    let ok = crate::auth::parse_full_token(&whole).is_some();
    ok.then_some(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_from_either_dsn_form() {
        let id = crate::auth::new_token_id();
        let secret = crate::auth::new_secret();
        let scram = format!("postgresql://{id}:{secret}@127.0.0.1:6432/sandpit");
        let clear = format!("postgresql://agent:{id}.{secret}@127.0.0.1:6432/sandpit");
        let want = Some(format!("{id}.{secret}"));
        assert_eq!(full_token_of_dsn(&scram), want);
        assert_eq!(full_token_of_dsn(&clear), want);
        assert_eq!(full_token_of_dsn("postgresql://agent:pw@h/db"), None);
        assert_eq!(full_token_of_dsn("not a dsn"), None);
    }

    #[test]
    fn long_reviews_are_cut_on_a_char_boundary() {
        let t = cut("é".repeat(MAX_REVIEW_TEXT));
        assert!(t.len() < MAX_REVIEW_TEXT + 100);
        assert!(t.ends_with("the harness has the whole of it)\n"));
        assert_eq!(cut("short".into()), "short");
    }
}
