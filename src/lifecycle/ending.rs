//! The end of an ended token, step by recorded step (see `registry::end`): its review is
//! taken and stored while its backend is kept, then the backend is destroyed. Run by `end`
//! right away, and again by the janitor for a token whose review failed or whose end a
//! crash cut short; an operator may discard the scratch data of a review that keeps failing.

use std::sync::Arc;

use crate::registry::end::{self, crash_point, EndEvent, EndPhase};
use crate::registry::TokenRecord;

use super::reap_report::ReapReport;
use super::{Gateway, LifecycleError};

/// Removes a token from the ends running in this process when dropped.
struct Running<'a>(&'a Gateway, &'a str);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.ending.remove(self.1);
    }
}

impl Gateway {
    /// Takes an ended token's end as far as it goes now: the review (if not stored yet),
    /// then the destroy. Returns the phase reached; None when this process is running the
    /// token's end already (or the token ended before ends were recorded and is done).
    pub async fn finish_end(&self, id: &str) -> Result<Option<EndPhase>, LifecycleError> {
        if self.ending.insert(id.to_string(), ()).is_some() {
            return Ok(None);
        }
        let _running = Running(self, id);
        // And one at a time across replicas sharing a registry (taken before a token's own
        // lock, as the janitor's is before this one); the record is read under it.
        let _across = self.registry.lock(&format!("end:{id}")).await?;
        let rec = self
            .registry
            .fresh(id)
            .await?
            .ok_or_else(|| LifecycleError::Unknown(id.into()))?;
        if rec.state.is_usable() {
            return Err(LifecycleError::NotUsable(id.into(), rec.state));
        }
        if end::needs_review(&rec) {
            let result = {
                // The janitor takes this slot before it destroys a backend: held here, it
                // cannot reap the backend while the hooks (review, validators, the change
                // kept for promotion) still read it.
                let rt = self.runtime(id);
                let _slot = rt.backend.lock().await;
                // The review reads the log: the outcomes deferred by its sessions first.
                self.logs.flush(id);
                self.hooks.ending(&rec).await
            };
            match result {
                Ok(()) => {
                    self.record_end(id, &EndEvent::ReviewStored).await?;
                    crash_point("end:reviewed");
                }
                Err(why) => {
                    tracing::warn!(token = %id, why = %why,
                        "end-of-token review failed; the backend is kept and the janitor tries again");
                    self.record_end(id, &EndEvent::ReviewFailed(why)).await?;
                    return Ok(Some(EndPhase::Ending));
                }
            }
        }
        self.logs.close(id);
        self.destroy_backend(id).await?;
        crash_point("end:destroyed");
        // Never forked: its pin alone may be keeping an old golden version.
        if let Some(v) = self.provider.versions() {
            v.unpin_golden(id).await?;
        }
        if rec.end.is_none() {
            return Ok(None);
        }
        self.record_end(id, &EndEvent::Destroyed).await?;
        Ok(Some(EndPhase::Destroyed))
    }

    /// An operator gives up on the review of an ended token whose review is not stored: its
    /// scratch data is destroyed without one (the token keeps saying why the review failed,
    /// and approval stays refused).
    pub async fn discard(&self, id: &str) -> Result<TokenRecord, LifecycleError> {
        self.record_end(id, &EndEvent::Discard).await?;
        tracing::warn!(token = %id, "scratch data discarded without a stored review");
        metrics::counter!("sandpit_reviews_discarded_total").increment(1);
        self.finish_end(id).await?;
        let rec = self
            .registry
            .fresh(id)
            .await?
            .ok_or_else(|| LifecycleError::Unknown(id.into()))?;
        self.hooks.discarded(&rec);
        Ok(rec)
    }

    /// Records one step of a token's end; refused steps are errors and change nothing.
    async fn record_end(&self, id: &str, event: &EndEvent) -> Result<(), LifecycleError> {
        let mut res = Ok(());
        let rec = self
            .registry
            .update(id, |r| res = end::apply(r, event))
            .await?;
        if rec.is_none() {
            return Err(LifecycleError::Unknown(id.into()));
        }
        res.map_err(LifecycleError::End)
    }
}

/// Finishes the end of every ended token whose review is not stored (it failed, or a crash
/// cut the end short): the review, then the destroy.
pub(super) async fn finish_ends<'a>(
    gw: &Arc<Gateway>,
    records: impl Iterator<Item = &'a TokenRecord>,
    report: &mut ReapReport,
) {
    let waiting: Vec<String> = records
        .filter(|r| end::needs_review(r))
        .map(|r| r.id.clone())
        .collect();
    for id in waiting {
        match gw.finish_end(&id).await {
            Ok(Some(end::EndPhase::Ending)) => {
                metrics::counter!("sandpit_janitor_review_failures_total").increment(1);
                report.review_failed.push(id);
            }
            Ok(Some(_)) => {
                tracing::info!(token = %id, "janitor: end-of-token review stored");
                metrics::counter!("sandpit_janitor_reviews_total").increment(1);
                report.reviewed.push(id);
            }
            Ok(None) => {}
            Err(e) => report
                .errors
                .push(format!("token {id}: finishing its end: {e}")),
        }
    }
}
