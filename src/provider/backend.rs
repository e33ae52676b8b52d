//! A backend as providers hand it out, and the tag it carries inside itself.

use serde::{Deserialize, Serialize};

use crate::pgconn::BackendTarget;

/// What a backend is tagged with, inside the backend itself, so a janitor can find it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendTag {
    /// Token id that owns the backend.
    pub token_id: String,
    /// Task name of the token.
    pub task: String,
    /// Expiry of the token, RFC 3339.
    pub expires_at: String,
    /// Id of the gateway (its data dir's `gateway.id`) that made the backend; empty in tags
    /// written before it existed.
    #[serde(default)]
    pub gateway_id: String,
    /// Golden version the token was pinned to when it was issued (None: the active one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden: Option<String>,
}

/// A running backend.
#[derive(Debug, Clone)]
pub struct Backend {
    /// Provider-specific handle, persisted in the registry (for `instance`: the instance dir name).
    pub handle: String,
    /// Where to connect.
    pub target: BackendTarget,
    /// How the fork was made ("reflink", "copy", "btrfs-snapshot", "restart", "adopted").
    pub method: String,
    /// Whether the backend runs in an empty network namespace.
    pub netns: bool,
    /// Golden version it was copied from, for providers that keep versions.
    pub golden: Option<String>,
}
