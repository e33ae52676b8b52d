//! What one janitor pass reports: the backends it destroyed (and why), left alone or found
//! vanished, the ends it finished, and its failures (`sandpit reap` and `POST /v1/reap` show it).

use serde::Serialize;

/// Why a backend was (or, in a dry run, would be) destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReapReason {
    /// Its token's TTL passed.
    Expired,
    /// Its token was revoked.
    Revoked,
    /// Its token is not in the registry.
    Unknown,
    /// Its token is valid but never recorded this backend: a fork interrupted by a crash.
    Orphan,
}

impl ReapReason {
    /// Label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ReapReason::Expired => "expired",
            ReapReason::Revoked => "revoked",
            ReapReason::Unknown => "unknown",
            ReapReason::Orphan => "orphan",
        }
    }
}

/// One backend the janitor destroyed.
#[derive(Debug, Clone, Serialize)]
pub struct Reaped {
    /// Provider handle.
    pub handle: String,
    /// Token id from the tag.
    pub token: String,
    /// Task from the tag.
    pub task: String,
    /// Why.
    pub reason: ReapReason,
}

/// One backend the janitor left alone although it is not a live token's.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Provider handle.
    pub handle: String,
    /// "untagged", "foreign" (tagged by another gateway, token unknown here) or "pool" (an
    /// unclaimed warm-pool member).
    pub why: &'static str,
}

/// What one pass found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReapReport {
    /// Whether this pass only looked.
    pub dry_run: bool,
    /// Backends the provider listed at the start of the pass.
    pub backends: usize,
    /// Backends of valid tokens, left running.
    pub kept: usize,
    /// Backends destroyed (or that would be, in a dry run).
    pub reaped: Vec<Reaped>,
    /// Tokens whose recorded backend no longer exists (marked, or would be).
    pub vanished: Vec<String>,
    /// Backends left alone.
    pub skipped: Vec<Skipped>,
    /// Failures, one line each; the pass goes on after one.
    pub errors: Vec<String>,
    /// Tokens revoked because their backend's access was tampered with.
    pub tampered: Vec<String>,
    /// Ended tokens whose end-of-token review this pass stored (their backends destroyed).
    pub reviewed: Vec<String>,
    /// Ended tokens whose end-of-token review failed again (their backends are kept; the
    /// token says why).
    pub review_failed: Vec<String>,
    /// Tokens whose server was found dead although the gateway had it running (not
    /// suspended while idle, not stopped at shutdown): restarted by this pass, unless it is
    /// a dry run or `errors` says the restart failed (then the next connection tries again).
    pub dead: Vec<String>,
}
