//! sandpit: a Postgres wire-protocol gateway that gives every AI-agent task its own
//! throwaway database, forked lazily from a golden snapshot.

pub mod auth;
pub mod cli;
pub mod config;
pub mod control;
pub mod datadir;
pub mod journal;
pub mod lifecycle;
pub mod mcp;
pub mod pg;
pub mod pgconn;
pub mod promote;
pub mod provider;
pub mod proxy;
pub mod registry;
pub mod review;
pub mod rfc3339;
pub mod server;
pub mod wire;
