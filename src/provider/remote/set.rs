//! Several sandbox services behind one provider (`remote.urls`, e.g. sandpit workers): a new
//! fork goes to the next service round-robin, skipping one that fails; a token keeps its
//! service, since its handle names it: `w<position in remote.urls>.<sandbox id>`.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::RemoteProvider;
use crate::provider::{Backend, BackendTag, BoxFuture, Provider, ProviderError};

/// The services, in `remote.urls` order, and where the next fork starts.
pub struct RemoteSet {
    members: Vec<(String, RemoteProvider)>,
    next: AtomicUsize,
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
        Ok(RemoteSet {
            members,
            next: AtomicUsize::new(0),
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
        match e {
            ProviderError::Remote(m) => {
                ProviderError::Remote(format!("worker {n} ({}): {m}", self.members[n].0))
            }
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
            let mut last = None;
            for k in 0..self.members.len() {
                let n = (start + k) % self.members.len();
                match self.members[n].1.fork(tag).await {
                    Ok(b) => return Ok(Self::prefixed(n, b)),
                    Err(e) => {
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
