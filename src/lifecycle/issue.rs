//! Issuing a token: what the harness asks for, the checks and defaults applied, the record
//! stored, and the view of a token the harness sees (never its secret but right at issue).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use time::OffsetDateTime;

use super::{issue_check, ms, Gateway, LifecycleError};
use crate::auth::{self, Verifier};
use crate::registry::{CapMode, Caps, TokenRecord, TokenState};
use crate::rfc3339::format as rfc3339;

/// What the harness asks for at issue.
#[derive(Debug, Clone, Default)]
pub struct IssueRequest {
    /// Task name.
    pub task: String,
    /// TTL; default from config.
    pub ttl: Option<Duration>,
    /// Row cap; default from config.
    pub max_rows: Option<u64>,
    /// Byte cap; default from config.
    pub max_bytes: Option<u64>,
    /// Concurrent sessions; default from config.
    pub max_connections: Option<u32>,
    /// Truncate (default) or error when a result exceeds a cap.
    pub cap_mode: Option<CapMode>,
    /// Seatbelt policy: allowed statement kinds (None = all).
    pub allow: Option<Vec<String>>,
    /// Statement timeout; default from config (zero = none).
    pub statement_timeout: Option<Duration>,
    /// Idle-in-transaction timeout; default from config (zero = none).
    pub idle_in_transaction_timeout: Option<Duration>,
    /// Free-form metadata.
    pub metadata: BTreeMap<String, String>,
    /// Sessions log in as a superuser of the token's own backend (providers whose
    /// [`Provider::superuser_logins`] is Some; refused elsewhere).
    pub superuser: bool,
}

/// A token as shown to the harness (never includes the secret, except `dsn` right at issue).
#[derive(Debug, Clone, Serialize)]
pub struct TokenView {
    /// Public id.
    pub id: String,
    /// Only at issue: the DSN the agent uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dsn: Option<String>,
    /// Task name.
    pub task: String,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Issue time, RFC 3339.
    pub created_at: String,
    /// Expiry, RFC 3339.
    pub expires_at: String,
    /// issued / live / expired / revoked.
    pub state: TokenState,
    /// Row cap per statement.
    pub max_rows: u64,
    /// Byte cap per statement.
    pub max_bytes: u64,
    /// Session cap.
    pub max_connections: u32,
    /// truncate / error.
    pub cap_mode: CapMode,
    /// Allowed statement kinds, when a seatbelt policy is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// Statement timeout, ms (0 = none).
    pub statement_timeout_ms: u64,
    /// Idle-in-transaction timeout, ms (0 = none).
    pub idle_in_transaction_timeout_ms: u64,
    /// Whether a backend exists now.
    pub backend: bool,
    /// Forks made for this token.
    pub fork_count: u64,
    /// Golden version its backend was copied from (instance provider), once forked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
    /// Whether its sessions log in as a superuser of its own backend.
    pub superuser: bool,
    /// Sessions open now.
    pub sessions: u32,
    /// How far its end has got: ending, reviewed, discarded, destroyed (absent while usable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<crate::registry::end::EndPhase>,
    /// Its end-of-token review: `stored`, `pending` or `failed: <reason>` (absent while usable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub review: Option<String>,
    /// Why it ended, when not by its TTL or a revoke (e.g. its worker was lost).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_why: Option<String>,
}

impl Gateway {
    /// Issue a token; returns its view with the DSN.
    pub async fn issue(self: &Arc<Self>, req: IssueRequest) -> Result<TokenView, LifecycleError> {
        let d = &self.config.tokens;
        if req.task.trim().is_empty() || req.task.len() > 200 {
            return Err(LifecycleError::Invalid(
                "task must be 1 to 200 characters".into(),
            ));
        }
        if req.task.contains(['/', '\\', '\0']) || req.task.starts_with('.') {
            return Err(LifecycleError::Invalid(
                "task must not contain '/', '\\' or NUL, nor start with '.'".into(),
            ));
        }
        let ttl = req.ttl.unwrap_or(d.ttl);
        if ttl.is_zero() || ttl > d.max_ttl {
            return Err(LifecycleError::Invalid(format!(
                "ttl must be between 1s and {}",
                crate::config::display_duration(d.max_ttl)
            )));
        }
        let max_rows = req.max_rows.unwrap_or(d.max_rows);
        let max_bytes = req.max_bytes.unwrap_or(d.max_bytes);
        let max_connections = req.max_connections.unwrap_or(d.max_connections);
        if max_rows == 0 || max_bytes == 0 || max_connections == 0 {
            return Err(LifecycleError::Invalid(
                "max_rows, max_bytes and max_connections must be at least 1".into(),
            ));
        }
        if let Some(limit) = self.config.max_connections_limit() {
            if max_connections > limit {
                return Err(LifecycleError::Invalid(format!(
                    "max_connections may be at most {limit} (what each scratch server admits: tokens.max_connections_limit, or postgres.max_connections - 5)"
                )));
            }
        }
        if max_rows > d.max_rows_limit || max_bytes > d.max_bytes_limit {
            return Err(LifecycleError::Invalid(format!(
                "max_rows may be at most {} and max_bytes at most {} (tokens.max_rows_limit / max_bytes_limit)",
                d.max_rows_limit, d.max_bytes_limit
            )));
        }
        let allow = issue_check::allow_kinds(req.allow)?;
        issue_check::superuser(req.superuser, self.provider.as_ref())?;
        let id = auth::new_token_id();
        let secret = auth::new_secret();
        let now = OffsetDateTime::now_utc();
        // A golden switched to after this is for tokens issued after it.
        let golden = match self.provider.versions() {
            Some(v) => v
                .pin_golden(&id, &rfc3339(now + ttl))
                .await
                .map_err(LifecycleError::Provider)?,
            None => None,
        };
        // PBKDF2 (4096 HMACs) off the async workers: a burst of issues must not hold the
        // relay's workers (a join error, a panic in it, recomputes here).
        let verifier = {
            let s = secret.clone();
            tokio::task::spawn_blocking(move || Verifier::from_secret(&s))
                .await
                .unwrap_or_else(|_| Verifier::from_secret(&secret))
        };
        let rec = TokenRecord {
            id: id.clone(),
            task: req.task,
            metadata: req.metadata,
            created_at: now,
            expires_at: now + ttl,
            caps: Caps {
                max_rows,
                max_bytes,
                max_connections,
                cap_mode: req.cap_mode.unwrap_or_default(),
                allow,
                statement_timeout_ms: ms(req.statement_timeout.unwrap_or(d.statement_timeout)),
                idle_in_transaction_timeout_ms: ms(req
                    .idle_in_transaction_timeout
                    .unwrap_or(d.idle_in_transaction_timeout)),
            },
            state: TokenState::Issued,
            verifier,
            backend: None,
            fork_count: 0,
            golden,
            superuser: req.superuser,
            ended_at: None,
            end: None,
            review_error: None,
            ended_why: None,
        };
        self.registry.insert(rec.clone()).await?;
        self.provider.expect_first_connection();
        self.hooks.issued(&rec);
        metrics::counter!("sandpit_tokens_issued_total").increment(1);
        self.schedule_expiry(&rec);
        let mut view = self.view(&rec);
        view.dsn = Some(format!(
            "postgresql://{}:{}@{}:{}/sandpit",
            id,
            secret,
            self.config.dsn_host(),
            self.config.listen.port()
        ));
        tracing::info!(token = %id, task = %rec.task, expires_at = %view.expires_at, "token issued");
        Ok(view)
    }

    /// The harness-facing view of a record.
    pub fn view(&self, rec: &TokenRecord) -> TokenView {
        let sessions = self
            .runtimes
            .get(&rec.id)
            .map(|r| r.sessions.load(Ordering::Acquire))
            .unwrap_or(0);
        TokenView {
            id: rec.id.clone(),
            dsn: None,
            task: rec.task.clone(),
            metadata: rec.metadata.clone(),
            created_at: rfc3339(rec.created_at),
            expires_at: rfc3339(rec.expires_at),
            state: rec.state,
            max_rows: rec.caps.max_rows,
            max_bytes: rec.caps.max_bytes,
            max_connections: rec.caps.max_connections,
            cap_mode: rec.caps.cap_mode,
            allow: rec.caps.allow.clone(),
            statement_timeout_ms: rec.caps.statement_timeout_ms,
            idle_in_transaction_timeout_ms: rec.caps.idle_in_transaction_timeout_ms,
            backend: rec.backend.is_some(),
            fork_count: rec.fork_count,
            golden: rec.golden.clone(),
            superuser: rec.superuser,
            sessions,
            end: rec.end,
            review: crate::registry::end::review_status(rec),
            ended_why: rec.ended_why.clone(),
        }
    }
}
