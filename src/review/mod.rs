//! What the agent did: the diff of its scratch database against the golden (schema, rows,
//! sequences) with a SQL patch a person may choose to apply. Its statements come from the
//! journal (`crate::journal`), which review reads and never the other way.

pub mod catalog;
pub mod conn;
pub mod data;
pub mod diff;
pub mod escape;
pub mod html;
pub mod model;
pub mod render;
pub mod reviewer;
pub mod schema;
pub mod sql;
pub mod store;
pub mod touched;
pub mod unmodeled;
pub mod verify;
