//! Warm-pool claims' re-tags, combined. A burst of first connections claims many members at
//! once, and each claim re-tags its member on the one kept admin session: one by one, each
//! re-tag waited for every earlier one's round trips, which on a busy server core was most
//! of a burst's claim time (measured: 1.6 s median of 100 claims). Now a claim queues its
//! re-tag, and whoever holds the kept session writes every queued one in one statement, so
//! a burst of claims costs a few round trips instead of one pair per claim.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tokio_postgres::Client;

use super::records::{tag_json, RECORDS_TABLE};
use super::{pg_err, tpl, TemplateProvider};
use crate::provider::{BackendTag, ProviderError};

/// One queued re-tag.
struct Queued {
    id: u64,
    handle: String,
    tag: String,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Oldest first.
    queued: Vec<Queued>,
    /// Callers still waiting for their result (a dropped caller is forgotten).
    waiting: HashSet<u64>,
    /// Results not yet picked up by their callers (the error's message on failure).
    done: HashMap<u64, Result<(), String>>,
}

/// The re-tags waiting for the kept admin session.
#[derive(Default)]
pub(super) struct RetagQueue {
    state: Mutex<State>,
}

/// A caller's place in the queue; dropping it (a cancelled claim) withdraws its re-tag if it
/// has not been written yet and forgets its result.
struct Ticket<'a> {
    queue: &'a RetagQueue,
    id: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut s = self.queue.lock();
        s.waiting.remove(&self.id);
        s.done.remove(&self.id);
        s.queued.retain(|q| q.id != self.id);
    }
}

impl RetagQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, handle: &str, tag: String) -> Ticket<'_> {
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        s.queued.push(Queued {
            id,
            handle: handle.to_string(),
            tag,
        });
        s.waiting.insert(id);
        Ticket { queue: self, id }
    }

    /// The result of `id`, when written.
    fn take_done(&self, id: u64) -> Option<Result<(), String>> {
        self.lock().done.remove(&id)
    }

    /// Every queued re-tag of a distinct handle, oldest first: one statement cannot change
    /// a row twice, so a second re-tag of a handle waits for the next statement.
    fn take_batch(&self) -> Vec<Queued> {
        let mut s = self.lock();
        let mut seen = HashSet::new();
        let mut batch = Vec::new();
        let mut left = Vec::new();
        for q in s.queued.drain(..) {
            if seen.insert(q.handle.clone()) {
                batch.push(q);
            } else {
                left.push(q);
            }
        }
        s.queued = left;
        batch
    }

    fn finish(&self, batch: &[Queued], result: &Result<(), String>) {
        let mut s = self.lock();
        for q in batch {
            if s.waiting.contains(&q.id) {
                s.done.insert(q.id, result.clone());
            }
        }
    }
}

impl TemplateProvider {
    /// Gives a claimed member the token's tag: queued, and written with every other queued
    /// re-tag by whoever holds the kept admin session (this caller, or one before it).
    pub(super) async fn retag_queued(
        &self,
        handle: &str,
        tag: &BackendTag,
    ) -> Result<(), ProviderError> {
        let ticket = self.retags.push(handle, tag_json(tag)?);
        loop {
            let mut slot = self.checker.lock().await;
            // Results are stored under this lock: not here now, it is still queued.
            if let Some(r) = self.retags.take_done(ticket.id) {
                return r.map_err(ProviderError::Template);
            }
            if slot.as_ref().is_none_or(|c| c.is_closed()) {
                // On failure the ticket's drop withdraws this re-tag; the others stay queued
                // for their own callers, each of which takes this lock after queueing.
                *slot = Some(self.connect(None).await?);
            }
            let Some(c) = slot.as_ref() else {
                return Err(tpl("no admin session"));
            };
            let batch = self.retags.take_batch();
            if batch.is_empty() {
                // Ours is neither queued nor written: cannot happen (results are stored
                // before this lock is let go); an error rather than a spin if it did.
                return Err(tpl("re-tag lost from its queue"));
            }
            let written = write_tags(c, &batch).await;
            if written.is_err() {
                *slot = None; // maybe a dead session: the next use logs in anew
            }
            self.retags
                .finish(&batch, &written.map_err(|e| e.to_string()));
        }
    }
}

/// One statement for the whole batch (one commit on the server, one round trip pair).
async fn write_tags(c: &Client, batch: &[Queued]) -> Result<(), ProviderError> {
    let handles: Vec<&str> = batch.iter().map(|q| q.handle.as_str()).collect();
    let tags: Vec<&str> = batch.iter().map(|q| q.tag.as_str()).collect();
    c.execute(
        &format!(
            "INSERT INTO {RECORDS_TABLE} (handle, tag) \
             SELECT h, t FROM unnest($1::text[], $2::text[]) AS u(h, t) \
             ON CONFLICT (handle) DO UPDATE SET tag = EXCLUDED.tag"
        ),
        &[&handles, &tags],
    )
    .await
    .map_err(|e| pg_err("re-tagging the scratch databases", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_holds_each_handle_once_and_a_dropped_ticket_is_withdrawn() {
        let q = RetagQueue::default();
        let a = q.push("pool-a", "1".into());
        let a2 = q.push("pool-a", "2".into());
        let b = q.push("pool-b", "3".into());
        let gone = q.push("pool-c", "4".into());
        drop(gone);
        let batch = q.take_batch();
        let got: Vec<(&str, &str)> = batch
            .iter()
            .map(|x| (x.handle.as_str(), x.tag.as_str()))
            .collect();
        assert_eq!(got, [("pool-a", "1"), ("pool-b", "3")]);
        q.finish(&batch, &Ok(()));
        assert_eq!(q.take_done(a.id), Some(Ok(())));
        assert_eq!(q.take_done(b.id), Some(Ok(())));
        // The second re-tag of pool-a waits for the next statement.
        assert_eq!(q.take_done(a2.id), None);
        let next = q.take_batch();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].tag, "2");
        // Its caller gave up meanwhile: the result is not kept for nobody.
        drop(a2);
        q.finish(&next, &Err("x".into()));
        assert!(q.lock().done.is_empty());
        assert!(q.take_batch().is_empty());
    }
}
