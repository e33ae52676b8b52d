//! The workers' room as fronts share it (`sandpit_workers` in a shared registry): a trait the
//! server wires to the registry, so this provider imports nothing above it. Fronts ask the
//! workers (`GET /v1/capacity`) on the workers' behalf and write the answers here; every
//! front places from the same rows and counts each fork it places in them at once.

use std::time::Duration;

use crate::provider::remote_api::Capacity;
use crate::provider::{BoxFuture, ProviderError};

/// What a worker last said about its room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// Never answered (or not since it was enlisted).
    None,
    /// It does not report capacity (404: a sandbox service that is not a sandpit worker).
    Unreported,
    /// Its capacity, with the forks placed by any front since.
    Capacity(Capacity),
}

/// One worker's row, with ages measured on the registry server's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// Its `remote.urls` entry.
    pub url: String,
    /// Its last answer.
    pub report: Report,
    /// Since that answer.
    pub age: Option<Duration>,
    /// Since the first question it failed to answer after its last answer (None: it answers).
    pub unreachable_for: Option<Duration>,
    /// Whether a front has declared it lost (its tokens ended).
    pub lost: bool,
}

/// One question's outcome, to record: answered (a report or none), or not answered.
pub type Answer = Option<Option<Capacity>>;

/// The shared book of the workers' room.
pub trait RoomBook: Send + Sync {
    /// Rows for these workers exist (empty ones are made).
    fn enlist<'a>(&'a self, urls: &'a [String]) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// The workers due a capacity question, claimed for this front (so one front asks each):
    /// not asked within `fresh`, or within `failed` for one whose last question failed.
    fn claim_due<'a>(
        &'a self,
        urls: &'a [String],
        fresh: Duration,
        failed: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, ProviderError>>;
    /// Records answers (`None`: no answer): a report replaces the row's room and clears its
    /// unreachable and lost marks; no answer starts the unreachable time if it had not begun.
    fn record<'a>(
        &'a self,
        answers: &'a [(String, Answer)],
    ) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// The rows of these workers.
    fn read<'a>(&'a self, urls: &'a [String]) -> BoxFuture<'a, Result<Vec<Seen>, ProviderError>>;
    /// Counts one fork placed on `url` if its report, younger than `fresh_within`, still
    /// leaves room; false when it does not (another front took the last room).
    fn reserve<'a>(
        &'a self,
        url: &'a str,
        fresh_within: Duration,
    ) -> BoxFuture<'a, Result<bool, ProviderError>>;
    /// Marks a worker lost; true for the one caller that marked it (it reports the loss).
    fn mark_lost<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<bool, ProviderError>>;
}
