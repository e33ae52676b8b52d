//! A provider over several workers (`remote.urls`) watches them: the capability the
//! lifecycle uses to end the tokens of a worker lost for good.

use std::time::Duration;

use super::BoxFuture;

/// A worker that has answered no capacity question for `remote.worker_lost_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWorker {
    /// Its position in `remote.urls` (the `w<n>.` of its tokens' handles).
    pub index: usize,
    /// Its URL.
    pub url: String,
    /// How long it has not answered.
    pub unreachable_for: Duration,
    /// Whether this front declared the loss (it logs and counts it; with a shared registry
    /// exactly one front does).
    pub declared_here: bool,
}

/// Several workers behind one provider.
pub trait Fleet: Send + Sync {
    /// Asks the workers due a capacity question and returns those newly found lost (once
    /// per loss in this process; a worker that answers again is no longer lost).
    fn check(&self) -> BoxFuture<'_, Vec<LostWorker>>;
    /// The worker a backend handle is on (its position in `remote.urls`).
    fn worker_of(&self, handle: &str) -> Option<usize>;
}
