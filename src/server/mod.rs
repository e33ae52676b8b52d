//! `sandpit serve`: `run` wires the pieces together and runs until a signal; `provider`
//! builds the provider the config names (`fleet`: its book of workers' room in a shared
//! registry); `error` says why `serve` could not start; `lock`
//! keeps one gateway per data dir; `stop` is the second signal's immediate stop of local servers;
//! `worker` is `serve` as a worker node that holds forks for front gateways.

mod error;
pub mod fleet;
mod lease;
pub mod lock;
mod provider;
mod run;
pub mod stop;
pub mod worker;

pub use error::ServeError;
pub use provider::{check_template_network, DEMO_GOLDEN_SQL};
pub use run::{admin_key, run};
