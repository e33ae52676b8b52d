//! The `remote` provider's book of the workers' room, kept in the shared registry: the
//! provider's `RoomBook` over the registry's `sandpit_workers` (neither imports the other,
//! so they meet here).

use std::time::Duration;

use crate::provider::remote::book::{Answer, Report, RoomBook, Seen};
use crate::provider::remote_api::Capacity;
use crate::provider::{BoxFuture, ProviderError};
use crate::registry::workers::{WorkerAnswer, WorkerBook, WorkerRoom};
use crate::registry::RegistryError;

/// `sandpit_workers` as the provider's book.
pub struct RegistryRooms(pub WorkerBook);

fn err(e: RegistryError) -> ProviderError {
    ProviderError::RoomBook(e.to_string())
}

fn room(c: &Capacity) -> WorkerRoom {
    WorkerRoom {
        max_sandboxes: c.max_sandboxes,
        sandboxes: c.sandboxes,
        warm: c.warm,
        draining: c.draining,
    }
}

impl RoomBook for RegistryRooms {
    fn enlist<'a>(&'a self, urls: &'a [String]) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.0.enlist(urls).await.map_err(err) })
    }

    fn claim_due<'a>(
        &'a self,
        urls: &'a [String],
        fresh: Duration,
        failed: Duration,
    ) -> BoxFuture<'a, Result<Vec<String>, ProviderError>> {
        Box::pin(async move { self.0.claim_due(urls, fresh, failed).await.map_err(err) })
    }

    fn record<'a>(
        &'a self,
        answers: &'a [(String, Answer)],
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let rows: Vec<(String, WorkerAnswer)> = answers
                .iter()
                .map(|(u, a)| {
                    let a = match a {
                        None => WorkerAnswer::Silent,
                        Some(None) => WorkerAnswer::NoReport,
                        Some(Some(c)) => WorkerAnswer::Room(room(c)),
                    };
                    (u.clone(), a)
                })
                .collect();
            self.0.record(&rows).await.map_err(err)
        })
    }

    fn read<'a>(&'a self, urls: &'a [String]) -> BoxFuture<'a, Result<Vec<Seen>, ProviderError>> {
        Box::pin(async move {
            let rows = self.0.read(urls).await.map_err(err)?;
            Ok(rows
                .into_iter()
                .map(|r| Seen {
                    url: r.url,
                    report: match r.room {
                        None => Report::None,
                        Some(None) => Report::Unreported,
                        Some(Some(w)) => Report::Capacity(Capacity {
                            max_sandboxes: w.max_sandboxes,
                            sandboxes: w.sandboxes,
                            warm: w.warm,
                            draining: w.draining,
                        }),
                    },
                    age: r.age,
                    unreachable_for: r.unreachable_for,
                    lost: r.lost,
                })
                .collect())
        })
    }

    fn reserve<'a>(
        &'a self,
        url: &'a str,
        fresh_within: Duration,
    ) -> BoxFuture<'a, Result<bool, ProviderError>> {
        Box::pin(async move { self.0.reserve(url, fresh_within).await.map_err(err) })
    }

    fn mark_lost<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<bool, ProviderError>> {
        Box::pin(async move { self.0.mark_lost(url).await.map_err(err) })
    }
}
