//! Fuzz target bodies for cargo-fuzz (see fuzz/README.md).

mod targets;
pub use targets::*;
