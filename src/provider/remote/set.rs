//! Several sandbox services behind one provider (`remote.urls`, e.g. sandpit workers): a new
//! fork goes to the service with the most room (see `rooms` for how the room is learnt and
//! `place` for the choice), skipping one that fails; a token keeps its service, since its
//! handle names it: `w<position in remote.urls>.<sandbox id>`. A worker silent for
//! `remote.worker_lost_after` is lost: `Fleet::check` reports it, the lifecycle ends its
//! tokens, destroys on it are skipped and the janitor lists the other members.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::book::RoomBook;
use super::rooms::Rooms;
use super::RemoteProvider;
use crate::provider::fleet::{Fleet, LostWorker};
use crate::provider::{Backend, BackendTag, BoxFuture, Provider, ProviderError};

/// The services, in `remote.urls` order, and what is known of their room.
pub struct RemoteSet {
    members: Vec<(String, RemoteProvider)>,
    /// Where ties start (round-robin among equal rooms).
    next: AtomicUsize,
    rooms: Rooms,
}

/// `w3.sbx-17` → (3, "sbx-17").
fn split(handle: &str) -> Option<(usize, &str)> {
    let (n, id) = handle.strip_prefix('w')?.split_once('.')?;
    Some((n.parse().ok()?, id))
}

impl RemoteSet {
    /// One member per (URL, provider); at least one.
    pub fn new(members: Vec<(String, RemoteProvider)>) -> Result<Self, ProviderError> {
        if members.is_empty() {
            return Err(ProviderError::Invalid("remote.urls is empty".into()));
        }
        let urls = members.iter().map(|(u, _)| u.clone()).collect();
        Ok(RemoteSet {
            members,
            next: AtomicUsize::new(0),
            rooms: Rooms::new(urls),
        })
    }

    /// Places by a shared registry's book of the workers' room instead of asking each
    /// worker per front; the members' rows are made there now.
    pub async fn with_book(mut self, book: Arc<dyn RoomBook>) -> Result<Self, ProviderError> {
        let urls: Vec<String> = self.members.iter().map(|(u, _)| u.clone()).collect();
        book.enlist(&urls).await?;
        self.rooms.set_book(book);
        Ok(self)
    }

    /// A worker silent this long is lost (zero: never).
    pub fn with_lost_after(mut self, after: Duration) -> Self {
        self.rooms.set_lost_after(after);
        self
    }

    /// The member a handle names, with the service's own sandbox id.
    fn member<'h>(
        &self,
        handle: &'h str,
    ) -> Result<(usize, &RemoteProvider, &'h str), ProviderError> {
        let (n, id) = split(handle)
            .ok_or_else(|| ProviderError::NotFound(format!("invalid handle {handle:?}")))?;
        let (_, p) = self.members.get(n).ok_or_else(|| {
            ProviderError::NotFound(format!("handle {handle:?} names no service in remote.urls"))
        })?;
        Ok((n, p, id))
    }

    /// The services, in `remote.urls` order.
    pub(super) fn members(&self) -> &[(String, RemoteProvider)] {
        &self.members
    }

    /// A member's error, naming the member (a gateway log line says which worker failed).
    pub(super) fn named(&self, n: usize, e: ProviderError) -> ProviderError {
        let worker = format!("worker {n} ({})", self.members[n].0);
        match e {
            ProviderError::Remote(m) => ProviderError::Remote(format!("{worker}: {m}")),
            ProviderError::RemoteHttp { what, source } => ProviderError::RemoteHttp {
                what: format!("{worker}: {what}"),
                source,
            },
            ProviderError::RemoteJson { what, source } => ProviderError::RemoteJson {
                what: format!("{worker}: {what}"),
                source,
            },
            other => other,
        }
    }

    fn prefixed(n: usize, mut b: Backend) -> Backend {
        b.handle = format!("w{n}.{}", b.handle);
        b
    }
}

impl Fleet for RemoteSet {
    fn check(&self) -> BoxFuture<'_, Vec<LostWorker>> {
        Box::pin(async move {
            self.rooms.refresh(&self.members, false).await;
            self.rooms.newly_lost().await
        })
    }

    fn worker_of(&self, handle: &str) -> Option<usize> {
        split(handle)
            .map(|(n, _)| n)
            .filter(|&n| n < self.members.len())
    }
}

impl Provider for RemoteSet {
    fn verify_forks_by_default(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        "remote"
    }

    fn fork<'a>(&'a self, tag: &'a BackendTag) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let start = self.next.fetch_add(1, Ordering::Relaxed);
            self.rooms.before_fork(&self.members).await;
            let mut tries = self.rooms.pick(start);
            if tries.is_empty() {
                // Every report says full or draining: ask again before refusing.
                self.rooms.refresh(&self.members, true).await;
                tries = self.rooms.pick(start);
            }
            if tries.is_empty() {
                return Err(self.rooms.no_room());
            }
            let mut last = None;
            for n in tries {
                // Counted at once, so forks placed before the next report spread out.
                if !self.rooms.take(n).await {
                    continue;
                }
                let result = self.members[n].1.fork(tag).await;
                self.rooms.forked(n, result.is_ok());
                match result {
                    Ok(b) => return Ok(Self::prefixed(n, b)),
                    Err(e) => {
                        let e = self.named(n, e);
                        tracing::warn!(worker = n, error = %e, "fork failed on this worker; trying the next");
                        last = Some(e);
                    }
                }
            }
            Err(last.unwrap_or_else(|| self.rooms.no_room()))
        })
    }

    fn ensure_running<'a>(
        &'a self,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let (n, p, id) = self.member(handle)?;
            match p.ensure_running(id).await {
                Ok(b) => Ok(Self::prefixed(n, b)),
                Err(e) => Err(self.named(n, e)),
            }
        })
    }

    fn destroy<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let (n, p, id) = self.member(handle)?;
            if self.rooms.is_lost(n) {
                // Gone with its worker; if the worker comes back, the janitor reaps it.
                tracing::info!(
                    worker = n,
                    handle,
                    "sandbox on a lost worker: nothing to delete"
                );
                return Ok(());
            }
            p.destroy(id).await.map_err(|e| self.named(n, e))
        })
    }

    fn stop<'a>(&'a self, _handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        // As for one service: the worker owns the sandbox's life; its TTL is the backstop.
        Box::pin(async { Ok(()) })
    }

    /// Every member's sandboxes but a lost one's. One member that cannot be listed fails the
    /// whole list: the janitor then acts on nothing, rather than ending tokens of a worker
    /// that is only slow.
    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for (n, (_, p)) in self.members.iter().enumerate() {
                if self.rooms.is_lost(n) {
                    continue;
                }
                let part = p.list().await.map_err(|e| self.named(n, e))?;
                out.extend(part.into_iter().map(|(h, t)| (format!("w{n}.{h}"), t)));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }

    fn secrets(&self) -> Vec<String> {
        self.members.iter().flat_map(|(_, p)| p.secrets()).collect()
    }

    /// A member that holds one already (no new sandbox), else a new one placed as a fork is
    /// (the goldens are the same SQL on every worker).
    fn reference<'a>(
        &'a self,
        golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let held: Vec<usize> = (0..self.members.len())
                .filter(|&i| self.members[i].1.holds_reference())
                .collect();
            let mut last = None;
            for &n in &held {
                match self.members[n].1.reference(golden).await {
                    Ok(b) => return Ok(Self::prefixed(n, b)),
                    Err(e) => last = Some(self.named(n, e)),
                }
            }
            self.rooms.before_fork(&self.members).await;
            let tries = self.rooms.pick(self.next.load(Ordering::Relaxed));
            if tries.is_empty() && last.is_none() {
                return Err(self.rooms.no_room());
            }
            for n in tries.into_iter().filter(|n| !held.contains(n)) {
                if !self.rooms.take(n).await {
                    continue;
                }
                match self.members[n].1.reference(golden).await {
                    Ok(b) => return Ok(Self::prefixed(n, b)),
                    Err(e) => last = Some(self.named(n, e)),
                }
            }
            Err(last.unwrap_or_else(|| ProviderError::Remote("no worker".into())))
        })
    }

    fn release_reference(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        Box::pin(async move {
            for (n, (_, p)) in self.members.iter().enumerate() {
                if let Err(e) = p.release_reference().await {
                    tracing::warn!(worker = n, error = %self.named(n, e), "releasing a review reference failed (its TTL reaps it)");
                }
            }
            Ok(())
        })
    }

    fn versions(&self) -> Option<&dyn crate::provider::GoldenVersions> {
        // Over sandpit workers; a service without the extension answers 501 (goldens.rs).
        Some(self)
    }

    fn fleet(&self) -> Option<&dyn Fleet> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn handles_name_their_member() {
        assert_eq!(split("w0.sbx-1"), Some((0, "sbx-1")));
        assert_eq!(split("w12.a.b"), Some((12, "a.b")));
        assert_eq!(split("sbx-1"), None);
        assert_eq!(split("wx.sbx"), None);
        assert_eq!(split("w1"), None);
    }
}
