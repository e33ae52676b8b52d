//! `sandpit serve`: `run` wires the pieces together and runs until a signal; `lock` keeps one
//! gateway per data dir; `stop` is the second signal's immediate stop of local servers.

pub mod lock;
mod run;
pub mod stop;

pub use run::{admin_key, check_template_network, run, ServeError, DEMO_GOLDEN_SQL};
