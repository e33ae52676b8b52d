//! Several sandbox services behind one provider (`remote.urls`, e.g. sandpit workers): a new
//! fork goes to the next service round-robin, skipping one that fails; a token keeps its
//! service, since its handle names it: `w<position in remote.urls>.<sandbox id>`. A service
//! whose fork failed is tried last for a short while, so a dead worker does not slow every
//! other new token down by its connect timeout and retries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::RemoteProvider;
use crate::provider::{Backend, BackendTag, BoxFuture, Provider, ProviderError};

/// The services, in `remote.urls` order, and where the next fork starts.
pub struct RemoteSet {
    members: Vec<(String, RemoteProvider)>,
    next: AtomicUsize,
    /// Per member: until when it is tried last, after a failed fork.
    failed_until: Mutex<Vec<Option<Instant>>>,
}

/// How long a member whose fork failed is tried after the others.
const FAILED_FOR: Duration = Duration::from_secs(10);

/// The order to try members in: round-robin from `start`, members that failed lately last.
fn order(start: usize, failed_until: &[Option<Instant>], now: Instant) -> Vec<usize> {
    let n = failed_until.len();
    let mut all: Vec<usize> = (0..n).map(|k| (start + k) % n).collect();
    // Stable: round-robin order is kept within each group.
    all.sort_by_key(|&i| failed_until[i].is_some_and(|t| t > now));
    all
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
        let n = members.len();
        Ok(RemoteSet {
            members,
            next: AtomicUsize::new(0),
            failed_until: Mutex::new(vec![None; n]),
        })
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

    /// A member's error, naming the member (a gateway log line says which worker failed).
    fn named(&self, n: usize, e: ProviderError) -> ProviderError {
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
            let tries = {
                let f = self.failed_until.lock().unwrap_or_else(|p| p.into_inner());
                order(start, &f, Instant::now())
            };
            let mut last = None;
            for n in tries {
                let result = self.members[n].1.fork(tag).await;
                let mut f = self.failed_until.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok(b) => {
                        f[n] = None;
                        return Ok(Self::prefixed(n, b));
                    }
                    Err(e) => {
                        f[n] = Some(Instant::now() + FAILED_FOR);
                        let e = self.named(n, e);
                        tracing::warn!(worker = n, error = %e, "fork failed on this worker; trying the next");
                        last = Some(e);
                    }
                }
            }
            Err(last.unwrap_or_else(|| ProviderError::Remote("no worker".into())))
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
            p.destroy(id).await.map_err(|e| self.named(n, e))
        })
    }

    fn stop<'a>(&'a self, _handle: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        // As for one service: the worker owns the sandbox's life; its TTL is the backstop.
        Box::pin(async { Ok(()) })
    }

    /// Every member's sandboxes. One member that cannot be listed fails the whole list: the
    /// janitor then acts on nothing, rather than ending tokens of a worker that is only slow.
    fn list(&self) -> BoxFuture<'_, Result<Vec<(String, Option<BackendTag>)>, ProviderError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for (n, (_, p)) in self.members.iter().enumerate() {
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

    /// The first member that can make one (the goldens are the same SQL on every worker).
    fn reference<'a>(
        &'a self,
        golden: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Backend, ProviderError>> {
        Box::pin(async move {
            let mut last = None;
            for (n, (_, p)) in self.members.iter().enumerate() {
                match p.reference(golden).await {
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
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{order, split};

    #[test]
    fn members_that_failed_lately_come_last() {
        let now = Instant::now();
        let later = Some(now + Duration::from_secs(5));
        let earlier = Some(now - Duration::from_secs(1));
        // (start, failed_until, order)
        let table: [(usize, Vec<Option<Instant>>, Vec<usize>); 5] = [
            (0, vec![None, None, None], vec![0, 1, 2]),
            (4, vec![None, None, None], vec![1, 2, 0]),
            (0, vec![later, None, None], vec![1, 2, 0]),
            (1, vec![None, later, None], vec![2, 0, 1]),
            (0, vec![earlier, None], vec![0, 1]),
        ];
        for (start, failed, want) in table {
            assert_eq!(order(start, &failed, now), want, "{start} {failed:?}");
        }
    }

    #[test]
    fn handles_name_their_member() {
        assert_eq!(split("w0.sbx-1"), Some((0, "sbx-1")));
        assert_eq!(split("w12.a.b"), Some((12, "a.b")));
        assert_eq!(split("sbx-1"), None);
        assert_eq!(split("wx.sbx"), None);
        assert_eq!(split("w1"), None);
    }
}
