//! Fuzz target bodies for cargo-fuzz (see fuzz/README.md).

pub mod differential;
mod targets;
pub use targets::*;
