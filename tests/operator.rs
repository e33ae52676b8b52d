//! What an operator meets: the CLI, metrics, crash safety and the janitor, faults under a
//! running gateway, the end of a token, the warm pool, idle suspend, the harness examples and SDKs.

// Each suite uses only part of the shared helpers.
#[allow(dead_code)]
mod support;

/// One file per concern, in tests/operator/.
mod operator {
    mod cli_output;
    mod crash_leaks;
    mod end_of_token;
    mod examples;
    mod metrics_at_start;
    mod operator_cli;
    mod operator_faults;
    mod ops;
    mod pool;
    mod sdk;
    mod suspend;
}
