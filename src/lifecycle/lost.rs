//! Tokens of a worker lost for good: a front over several workers (`remote.urls`) asks them
//! for their capacity every second or so (`Fleet::check`); one silent past
//! `remote.worker_lost_after` is lost, and every usable token whose backend is on it is ended
//! (revoked, with the reason the client and `token show` see). Its review cannot be made (the
//! scratch database went with the worker), so the end records why and discards it.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::watch;

use super::{EndReason, Gateway, LifecycleError};
use crate::provider::fleet::LostWorker;
use crate::registry::end::{self, EndEvent};
use crate::registry::TokenState;

/// How often the workers are watched.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// What a client and `token show` are told about a token of a lost worker.
pub const WORKER_LOST: &str = "the worker holding its scratch database was lost";

impl Gateway {
    /// Ends a token whose worker was lost: revoked with `why`, its review recorded as not
    /// made, its backend forgotten (the provider skips a lost worker's destroy). Returns
    /// false when it had ended already.
    pub async fn end_lost(&self, id: &str, why: &str) -> Result<bool, LifecycleError> {
        let mut changed = false;
        let rec = self
            .registry
            .update(id, |r| {
                if r.state.is_usable() {
                    end::begin(r, TokenState::Revoked);
                    r.ended_at = Some(OffsetDateTime::now_utc());
                    r.ended_why = Some(why.to_string());
                    // Ending → Ending (with the reason) → Discarded: both allowed steps.
                    let _ = end::apply(r, &EndEvent::ReviewFailed(format!("not made: {why}")));
                    let _ = end::apply(r, &EndEvent::Discard);
                    changed = true;
                }
            })
            .await?
            .ok_or_else(|| LifecycleError::Unknown(id.into()))?;
        if !changed {
            self.end_sessions_here(&rec);
            return Ok(false);
        }
        tracing::warn!(token = %id, why, "token ended: its worker was lost");
        metrics::counter!("sandpit_tokens_ended_total", "reason" => "revoked").increment(1);
        metrics::counter!("sandpit_tokens_lost_total").increment(1);
        self.runtime(id)
            .ended
            .send_replace(Some(EndReason::WorkerLost));
        self.await_sessions_elsewhere(id).await;
        self.finish_end(id).await?;
        self.hooks.discarded(&rec);
        Ok(true)
    }

    /// Ends the usable tokens whose backend is on `w`; returns how many this call ended.
    async fn end_tokens_of(&self, w: &LostWorker) -> usize {
        let Some(fleet) = self.provider.fleet() else {
            return 0;
        };
        let on_it: Vec<String> = self
            .registry
            .list()
            .into_iter()
            .filter(|r| r.state.is_usable())
            .filter(|r| {
                r.backend
                    .as_deref()
                    .is_some_and(|h| fleet.worker_of(h) == Some(w.index))
            })
            .map(|r| r.id)
            .collect();
        let mut ended = 0;
        for id in on_it {
            match self.end_lost(&id, WORKER_LOST).await {
                Ok(true) => ended += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(token = %id, error = %e, "ending a lost worker's token failed; tried again at the next loss check")
                }
            }
        }
        ended
    }
}

/// Watches the workers of a provider that has several, until `stop`; None for the others.
pub fn spawn_watch(
    gw: Arc<Gateway>,
    mut stop: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    gw.provider.fleet()?;
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
            let Some(fleet) = gw.provider.fleet() else {
                return;
            };
            for w in fleet.check().await {
                if w.declared_here {
                    metrics::counter!("sandpit_workers_lost_total").increment(1);
                    tracing::error!(worker = w.index, url = %w.url,
                        silent_s = w.unreachable_for.as_secs(),
                        "worker lost: it answered nothing for remote.worker_lost_after; its tokens are ended");
                }
                let ended = gw.end_tokens_of(&w).await;
                tracing::info!(
                    worker = w.index,
                    tokens = ended,
                    "tokens of a lost worker ended"
                );
            }
        }
    }))
}
