//! What the agent did: the statement log, and (later) the diff against the golden.

pub mod classify;
pub mod log;
