//! Helpers shared by the test suites: the gateway harness, shared Postgres servers, raw
//! wire clients, the test sandbox service, scratch dirs and capability checks.

pub mod harness;
pub mod microvm_checks;
pub mod netns;
pub mod remote_server;
pub mod require;
pub mod shared_pg;
pub mod tempdir;
pub mod wire;
