//! `# HELP` / `# TYPE` for every metric, and zero values for those a dashboard or alert
//! reads before the first event (an absent series and a zero differ in PromQL: `increase()`
//! of a counter born at 1 misses that first event). docs/operations.md's metrics table lists the same
//! names; `tests/checks/docs.rs` keeps the two and the code in step.

/// Kind of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Monotonic count.
    Counter,
    /// Value that goes up and down.
    Gauge,
    /// Distribution (buckets for `sandpit_fork_seconds`, a summary otherwise).
    Histogram,
}

use MetricKind::{Counter, Gauge, Histogram};

/// `kind` of the statement counters: every kind `journal::classify::Kind` spells.
const KINDS: &[&[(&str, &str)]] = &[
    &[("kind", "read")],
    &[("kind", "write")],
    &[("kind", "ddl")],
    &[("kind", "transaction")],
    &[("kind", "privilege")],
    &[("kind", "utility")],
    &[("kind", "unparsed")],
];

/// Every metric sandpit records: name, kind, help text, label sets present from the start
/// (`&[&[]]`: the unlabelled series). Empty: none here, for the gauges the start itself sets
/// (the janitor's first pass, the golden check) and for the two labelled by the fork method,
/// which depends on the provider and the filesystem and is known at the first fork.
#[allow(clippy::type_complexity)]
pub const METRICS: &[(&str, MetricKind, &str, &[&[(&str, &str)]])] = &[
    (
        "sandpit_backends",
        Gauge,
        "Scratch databases that exist now.",
        &[&[]],
    ),
    (
        "sandpit_tokens",
        Gauge,
        "Tokens in the registry, by state.",
        &[],
    ),
    (
        "sandpit_sessions",
        Gauge,
        "Client sessions open now.",
        &[&[]],
    ),
    (
        "sandpit_pool_ready",
        Gauge,
        "Warm-pool forks ready for new tokens.",
        &[&[]],
    ),
    (
        "sandpit_pool_target",
        Gauge,
        "Warm-pool members wanted now: pool.size, or more up to pool.max_size under demand.",
        &[&[]],
    ),
    (
        "sandpit_sessions_total",
        Counter,
        "Client sessions opened.",
        &[&[]],
    ),
    (
        "sandpit_forks_total",
        Counter,
        "Backends forked, by method.",
        &[],
    ),
    (
        "sandpit_first_query_phase_seconds",
        Histogram,
        "Time of each phase of a token's first connection (auth, claim and its parts, backend_connect, greet).",
        &[&[("phase", "auth")], &[("phase", "claim")], &[("phase", "claim_lock")], &[("phase", "claim_provider")], &[("phase", "claim_record")], &[("phase", "backend_connect")], &[("phase", "greet")]],
    ),
    (
        "sandpit_fork_seconds",
        Histogram,
        "Time to fork and start a backend, by method.",
        &[],
    ),
    (
        "sandpit_destroys_total",
        Counter,
        "Backends destroyed (revoke, expiry, janitor).",
        &[&[]],
    ),
    (
        "sandpit_suspends_total",
        Counter,
        "Idle backends stopped with their data kept.",
        &[&[]],
    ),
    (
        "sandpit_golden_builds_total",
        Counter,
        "Golden versions built from a live database.",
        &[&[]],
    ),
    (
        "sandpit_tokens_issued_total",
        Counter,
        "Tokens issued.",
        &[&[]],
    ),
    (
        "sandpit_tokens_ended_total",
        Counter,
        "Tokens ended, by reason (expired, revoked).",
        &[&[("reason", "expired")], &[("reason", "revoked")]],
    ),
    (
        "sandpit_tokens_tampered_total",
        Counter,
        "Tokens revoked because their backend's access was changed from inside.",
        &[&[]],
    ),
    (
        "sandpit_template_tampered_total",
        Counter,
        "Template task roles found changed outside the gateway and closed.",
        &[&[]],
    ),
    (
        "sandpit_janitor_runs_total",
        Counter,
        "Janitor passes (dry runs not counted).",
        &[&[]],
    ),
    (
        "sandpit_janitor_reviews_total",
        Counter,
        "End-of-token reviews the janitor stored for ended tokens (a failed review retried, an end a crash cut short).",
        &[&[]],
    ),
    (
        "sandpit_janitor_review_failures_total",
        Counter,
        "End-of-token reviews the janitor retried that failed again (the backend is kept).",
        &[&[]],
    ),
    (
        "sandpit_reviews_discarded_total",
        Counter,
        "Ended tokens whose scratch data an operator discarded without a stored review.",
        &[&[]],
    ),
    (
        "sandpit_janitor_reaped_total",
        Counter,
        "Backends the janitor destroyed, by reason.",
        &[
            &[("reason", "expired")],
            &[("reason", "revoked")],
            &[("reason", "unknown")],
            &[("reason", "orphan")],
        ],
    ),
    (
        "sandpit_janitor_vanished_total",
        Counter,
        "Tokens whose backend had vanished.",
        &[&[]],
    ),
    (
        "sandpit_janitor_dead_backends_total",
        Counter,
        "Scratch servers found dead under a running gateway and restarted by the janitor.",
        &[&[]],
    ),
    (
        "sandpit_golden_sql_stale",
        Gauge,
        "1 while the golden SQL file could not be built and the previous golden serves instead.",
        &[],
    ),
    (
        "sandpit_log_quota_exceeded_total",
        Counter,
        "Statements refused (58030) because their record would pass log.max_bytes_per_token.",
        &[&[]],
    ),
    (
        "sandpit_log_fill_warnings_total",
        Counter,
        "Token statement logs that reached 80 % or 95 % of log.max_bytes_per_token (each level once).",
        &[&[]],
    ),
    (
        "sandpit_registry_reserve_writes_total",
        Counter,
        "Token changes written into a token's reserve file because the disk was full.",
        &[&[]],
    ),
    (
        "sandpit_forks_refused_low_disk_total",
        Counter,
        "Forks refused because the data dir's filesystem had less than limits.min_free_bytes free.",
        &[&[]],
    ),
    (
        "sandpit_data_dir_free_bytes",
        Gauge,
        "Bytes free on the data dir's filesystem (forks, statement logs, reviews), at each janitor pass.",
        &[],
    ),
    (
        "sandpit_janitor_errors_total",
        Counter,
        "Failures during janitor passes.",
        &[&[]],
    ),
    (
        "sandpit_statements_total",
        Counter,
        "Statements relayed, by kind.",
        KINDS,
    ),
    (
        "sandpit_capped_statements_total",
        Counter,
        "Statements whose result hit a row or byte cap.",
        &[&[]],
    ),
    (
        "sandpit_denied_statements_total",
        Counter,
        "Statements refused by a token's seatbelt policy, by kind.",
        KINDS,
    ),
    (
        "sandpit_statement_timeouts_total",
        Counter,
        "Requests the gateway cancelled past the token's statement_timeout.",
        &[&[]],
    ),
    (
        "sandpit_log_errors_total",
        Counter,
        "Statement log writes that failed.",
        &[&[]],
    ),
    (
        "sandpit_unlogged_refusals_total",
        Counter,
        "Requests refused (58030) because their statement record could not be written.",
        &[&[]],
    ),
    (
        "sandpit_stray_results_total",
        Counter,
        "Results no statement expected, capped and passed on.",
        &[&[]],
    ),
    (
        "sandpit_capped_notices_total",
        Counter,
        "Stretches (statement to ReadyForQuery) whose notices or notifications were cut at max_bytes.",
        &[&[]],
    ),
    (
        "sandpit_tracking_limit_refusals_total",
        Counter,
        "Parse/Bind refused past the session's prepared-statement tracking limit.",
        &[&[]],
    ),
    (
        "sandpit_bytes_total",
        Counter,
        "Bytes relayed, by direction.",
        &[&[("direction", "client_to_backend")], &[("direction", "backend_to_client")]],
    ),
    (
        "sandpit_auth_failures_total",
        Counter,
        "Failed client logins, by reason.",
        &[&[("reason", "unknown")], &[("reason", "wrong_secret")], &[("reason", "expired")], &[("reason", "revoked")], &[("reason", "cleartext_without_tls")], &[("reason", "protocol")], &[("reason", "timeout")], &[("reason", "registry")]],
    ),
    (
        "sandpit_auth_rate_limited_total",
        Counter,
        "Failed logins answered late past limits.auth_failures_per_minute.",
        &[&[]],
    ),
    (
        "sandpit_sessions_paced_total",
        Counter,
        "New sessions over their token's pace (limits.sessions_per_second): waited, or refused.",
        &[&[("outcome", "waited")], &[("outcome", "refused")]],
    ),
    (
        "sandpit_registry_limit_errors_total",
        Counter,
        "Fleet-wide limit checks the shared registry could not answer (this front's own limit decided), by limit.",
        &[&[("limit", "pace")], &[("limit", "auth")]],
    ),
    (
        "sandpit_api_auth_failures_total",
        Counter,
        "Control API calls without the right admin key.",
        &[&[]],
    ),
    (
        "sandpit_mcp_auth_failures_total",
        Counter,
        "POST /mcp calls without a valid token.",
        &[&[]],
    ),
    (
        "sandpit_mcp_requests_total",
        Counter,
        "MCP requests served, by transport.",
        &[&[("transport", "http")]],
    ),
    (
        "sandpit_cancel_requests_total",
        Counter,
        "Cancel requests, by result.",
        &[&[("result", "forwarded")], &[("result", "forwarded_shared")], &[("result", "failed")], &[("result", "unknown")]],
    ),
    (
        "sandpit_backend_reconnects_total",
        Counter,
        "Backend connections that failed and were retried after checking the backend.",
        &[&[]],
    ),
    (
        "sandpit_registry_busy_total",
        Counter,
        "Registry queries refused because all of registry.max_connections stayed busy past registry.acquire_timeout.",
        &[&[]],
    ),
    (
        "sandpit_registry_reconnects_total",
        Counter,
        "Times the shared registry's change feed was lost and re-established.",
        &[&[]],
    ),
    (
        "sandpit_protocol_violations_total",
        Counter,
        "Connections closed for protocol abuse, by kind.",
        &[
            &[("kind", "client_frame")],
            &[("kind", "ssl_early_bytes")],
            &[("kind", "direct_tls_without_tls")],
        ],
    ),
    (
        "sandpit_review_seconds",
        Histogram,
        "Time to take a review.",
        &[&[]],
    ),
    (
        "sandpit_review_verifications_total",
        Counter,
        "Patch checks of reviews (the patch replayed on a fresh fork), by result: exact, differs, not_verified.",
        &[&[("result", "exact")], &[("result", "differs")], &[("result", "not_verified")]],
    ),
    (
        "sandpit_review_failures_total",
        Counter,
        "Reviews at the end of a token that failed (its backend is kept; the janitor tries again).",
        &[&[]],
    ),
    (
        "sandpit_review_approvals_total",
        Counter,
        "Review decisions that approved a token's change.",
        &[&[]],
    ),
    (
        "sandpit_review_rejections_total",
        Counter,
        "Review decisions that rejected a token's change.",
        &[&[]],
    ),
    (
        "sandpit_promotions_total",
        Counter,
        "Promotion attempts, by outcome (applied, dry_run, conflicts, refused, failed).",
        &[&[("outcome", "applied")], &[("outcome", "dry_run")], &[("outcome", "conflicts")], &[("outcome", "refused")], &[("outcome", "failed")]],
    ),
    (
        "sandpit_promote_conflicts_total",
        Counter,
        "Rows and objects that had moved in a promotion target since the golden.",
        &[&[]],
    ),
    (
        "sandpit_validator_runs_total",
        Counter,
        "Validator runs against scratch databases at a token's end, by result (pass, fail).",
        &[&[("result", "pass")], &[("result", "fail")]],
    ),
    (
        "sandpit_remote_failures_total",
        Counter,
        "Calls to the remote provider's service that failed after their retries.",
        &[&[]],
    ),
    (
        "sandpit_workers_lost_total",
        Counter,
        "Workers declared lost: silent past remote.worker_lost_after (counted by the front that declared it).",
        &[&[]],
    ),
    (
        "sandpit_tokens_lost_total",
        Counter,
        "Tokens ended because the worker holding their backend was lost.",
        &[&[]],
    ),
    (
        "sandpit_remote_retries_total",
        Counter,
        "Calls to the remote provider's service retried.",
        &[&[]],
    ),
];

/// Registers the help text of every metric with the installed recorder and creates the
/// series that start at zero. Call once, after the recorder is installed.
pub fn describe_metrics() {
    for &(name, kind, help, zeros) in METRICS {
        match kind {
            Counter => {
                metrics::describe_counter!(name, help);
                for labels in zeros {
                    let labels: Vec<metrics::Label> = labels
                        .iter()
                        .map(|&(k, v)| metrics::Label::new(k, v))
                        .collect();
                    metrics::counter!(name, labels).increment(0);
                }
            }
            Gauge => {
                metrics::describe_gauge!(name, help);
                for labels in zeros {
                    let labels: Vec<metrics::Label> = labels
                        .iter()
                        .map(|&(k, v)| metrics::Label::new(k, v))
                        .collect();
                    metrics::gauge!(name, labels).increment(0.0);
                }
            }
            Histogram => {
                metrics::describe_histogram!(name, help);
                // A registered histogram is exported with a zero count before its first sample.
                for labels in zeros {
                    let labels: Vec<metrics::Label> = labels
                        .iter()
                        .map(|&(k, v)| metrics::Label::new(k, v))
                        .collect();
                    let _ = metrics::histogram!(name, labels);
                }
            }
        }
    }
}
