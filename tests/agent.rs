//! What an agent meets through the gateway: the spine end to end, caps and the write-ahead
//! log, the seatbelt, hostile SQL and hostile wire clients, the client matrix, MCP mode, the
//! log's quota and a load test, a full disk.

// Each suite uses only part of the shared helpers.
#[allow(dead_code)]
mod support;

/// One file per concern, in tests/agent/.
mod agent {
    mod caps;
    mod clients;
    mod containment;
    mod disk_full;
    mod e2e;
    mod enforcement;
    mod hardening;
    mod hostile_clients;
    mod log_load;
    mod log_quota;
    mod mcp;
    mod policy;
    mod seatbelt_roles;
    mod statement_names;
}
