//! The `remote` provider's HTTP exchanges with the sandbox service: one request with a
//! bounded body, retries with backoff for what may pass (connect errors, timeouts, 429, 5xx),
//! and decoding of the service's JSON answers and errors; the one-shot capacity question.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{api, remote, RemoteProvider};
use crate::provider::ProviderError;

/// Largest response body accepted from the service.
const MAX_BODY: usize = 4 * 1024 * 1024;
/// First retry delay; doubled per attempt.
const BACKOFF: Duration = Duration::from_millis(200);

/// What one HTTP exchange ended with.
enum Outcome {
    /// A status and its (bounded) body.
    Answer(StatusCode, Vec<u8>),
    /// No answer: connect error, timeout, reset.
    NoAnswer(reqwest::Error),
}

impl RemoteProvider {
    /// One exchange, no retries.
    async fn once(
        &self,
        method: &Method,
        path: &str,
        body: Option<&serde_json::Value>,
        idem: Option<&str>,
    ) -> Outcome {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(k) = &self.cfg.api_key {
            req = req.bearer_auth(k);
        }
        if let Some(k) = idem {
            req = req.header(api::IDEMPOTENCY_KEY, k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let mut resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return Outcome::NoAnswer(e),
        };
        let status = resp.status();
        let mut buf = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    if buf.len() + c.len() > MAX_BODY {
                        // Treated as a broken answer, not retried.
                        return Outcome::Answer(
                            status,
                            b"{\"error\":\"response too large\"}".to_vec(),
                        );
                    }
                    buf.extend_from_slice(&c);
                }
                Ok(None) => break,
                Err(e) => return Outcome::NoAnswer(e),
            }
        }
        Outcome::Answer(status, buf)
    }

    /// An exchange with retries (connect errors, timeouts, 429, 5xx) and exponential backoff,
    /// never past `deadline`. Returns the final status and body.
    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        idem: Option<&str>,
        deadline: Instant,
    ) -> Result<(StatusCode, Vec<u8>), ProviderError> {
        let mut attempt = 0u32;
        loop {
            let out = self.once(&method, path, body, idem).await;
            let retry_why = match out {
                Outcome::Answer(s, _)
                    if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS =>
                {
                    format!("HTTP {s}")
                }
                Outcome::Answer(s, b) => return Ok((s, b)),
                Outcome::NoAnswer(e) => format!("{e}"),
            };
            let delay = BACKOFF * 2u32.saturating_pow(attempt);
            if attempt >= self.cfg.retries || Instant::now() + delay >= deadline {
                metrics::counter!("sandpit_remote_failures_total").increment(1);
                return Err(remote(format!(
                    "{method} {path}: {retry_why} (after {} attempts)",
                    attempt + 1
                )));
            }
            tracing::warn!(%method, path, attempt, error = %retry_why, "remote service call failed; retrying");
            metrics::counter!("sandpit_remote_retries_total").increment(1);
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// `GET /v1/capacity`, once (no retries), answered within `within`. Ok(None): the
    /// service does not report capacity (404, 405, 501: not a sandpit worker).
    pub(super) async fn capacity(
        &self,
        within: Duration,
    ) -> Result<Option<api::Capacity>, ProviderError> {
        const PATH: &str = "/v1/capacity";
        let out = tokio::time::timeout(within, self.once(&Method::GET, PATH, None, None))
            .await
            .map_err(|_| {
                remote(format!(
                    "GET {PATH}: no answer within {} ms",
                    within.as_millis()
                ))
            })?;
        match out {
            Outcome::NoAnswer(e) => Err(remote(format!("GET {PATH}: {e}"))),
            Outcome::Answer(
                StatusCode::NOT_FOUND
                | StatusCode::METHOD_NOT_ALLOWED
                | StatusCode::NOT_IMPLEMENTED,
                _,
            ) => Ok(None),
            Outcome::Answer(s, b) if s.is_success() => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| ProviderError::RemoteJson {
                    what: format!("GET {PATH}: bad response"),
                    source,
                }),
            Outcome::Answer(s, _) => Err(remote(format!("GET {PATH}: HTTP {s}"))),
        }
    }

    /// `call` and decode a success body as `T`; an error status becomes an error with the
    /// service's message.
    pub(super) async fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        idem: Option<&str>,
        deadline: Instant,
    ) -> Result<(StatusCode, Option<T>), ProviderError> {
        let (status, bytes) = self
            .call(method.clone(), path, body, idem, deadline)
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok((status, None));
        }
        if !status.is_success() {
            let msg = serde_json::from_slice::<api::ApiError>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into());
            return Err(remote(format!("{method} {path}: HTTP {status}: {msg}")));
        }
        if bytes.is_empty() {
            return Ok((status, None));
        }
        let v = serde_json::from_slice(&bytes).map_err(|source| ProviderError::RemoteJson {
            what: format!("{method} {path}: bad response"),
            source,
        })?;
        Ok((status, Some(v)))
    }
}

pub(super) fn json<T: Serialize>(v: &T) -> Result<serde_json::Value, ProviderError> {
    serde_json::to_value(v).map_err(|source| ProviderError::RemoteJson {
        what: "encoding request".into(),
        source,
    })
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub(super) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
