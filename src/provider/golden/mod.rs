//! Goldens: what every fork copies. A golden is a stopped, cleanly shut down data directory
//! (for `microvm`: a VM snapshot), built from the golden SQL file ([`sql`]) or from a live
//! database ([`live`]), with the roles of [`roles`]; providers that keep several versions
//! keep them in the files of [`store`], with the logic they share in [`versions`].

pub mod build;
pub mod live;
pub mod psql;
pub mod roles;
pub mod socket_dir;
pub mod sql;
pub mod store;
pub mod versions;

use std::path::Path;

use crate::pg::user::RunAs;
use crate::pg::PgBinaries;

// The vocabulary other providers and the review use, named where it is used most.
pub use psql::tail;
pub use roles::{
    login_role, predates_policy_roles, AGENT, AGENT_READ, AGENT_WRITE, DATABASE, REVIEWER,
    SUPERUSER,
};
pub use socket_dir::{prepare_socket_dir, remove_socket_dir, socket_dir_for};

/// Bump when the way the golden is built changes, so old goldens are rebuilt.
/// v2: the database belongs to the admin role, and the golden has a login role per seatbelt
/// level and one for the review.
pub const GOLDEN_FORMAT: &str = "sandpit-golden-v2";
/// Written last into a finished golden; a golden without it is never used.
pub const READY_MARKER: &str = "sandpit-golden-ready";

/// Everything a golden build needs.
pub struct GoldenCtx<'a> {
    /// Server binaries.
    pub bins: &'a PgBinaries,
    /// OS user Postgres runs as.
    pub run_as: &'a RunAs,
    /// Start servers in an empty network namespace.
    pub netns: bool,
    /// Real (canonical) provider root.
    pub root: &'a Path,
    /// SQL file the golden is built from.
    pub sql_path: &'a Path,
    /// OS user of the gateway (peer identity mapped to the agent and superuser roles).
    pub gateway_user: &'a str,
    /// `max_connections` for the build server.
    pub max_connections: u32,
}

/// What fills a new golden's `sandpit` database.
pub enum Load<'a> {
    /// Run a SQL file as the agent.
    Sql(&'a Path),
    /// Copy (and mask) a live database.
    Live(&'a live::LiveSpec),
}
