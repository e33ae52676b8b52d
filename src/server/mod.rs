//! `sandpit serve`: `run` wires the pieces together and runs until a signal; `lock` keeps one
//! gateway per data dir; `stop` is the second signal's immediate stop of local servers;
//! `worker` is `serve` as a worker node that holds forks for front gateways.

pub mod lock;
mod run;
pub mod stop;
pub mod worker;

pub use run::{admin_key, check_template_network, run, ServeError, DEMO_GOLDEN_SQL};
