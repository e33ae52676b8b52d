//! What the agent did: the statement log, and the diff of its scratch database against the
//! golden (schema, rows, sequences) with a SQL patch a person may choose to apply.

pub mod catalog;
pub mod classify;
pub mod conn;
pub mod data;
pub mod diff;
pub mod html;
pub mod log;
pub mod model;
pub mod objects;
pub mod relations;
pub mod render;
pub mod schema;
pub mod store;
