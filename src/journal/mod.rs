//! The journal: what an agent's statements were. The write-ahead statement log (records,
//! line format, per-token quota, streaming reader) and statement classification. The proxy
//! writes it, review and the control API read it; it depends on nothing above it.

pub mod classify;
pub mod log;
pub mod tag_kind;
