//! A future that is polled again only after its own waker fired.
//!
//! The relay's `select!` polls every enabled branch each time the session wakes, about
//! four times per round trip. For the token's end (a watch) and the statement timer (a
//! sleep) that is a waker re-registered for nothing; for a socket read that found nothing
//! the last time, a readiness check and its bookkeeping (most of a round trip's read
//! polls). Behind a [`Gate`] (a future) or a [`Latch`] (a read), the poll goes through when
//! it asked to be (its waker fired), when it was re-armed, or the first time; otherwise the
//! answer is `Pending` at the cost of one atomic swap.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The waker the gated future is given: notes that it fired, then wakes the task.
struct Flag {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        // A poisoned lock only means a panic elsewhere while holding it; the waker is intact.
        let task = match self.task.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        if let Some(w) = task.as_ref() {
            w.wake_by_ref();
        }
    }
}

/// The gating itself, for a poll that is not one future: fired (poll through) or not
/// (answer `Pending`), and the waker the gated poll is given.
pub struct Latch {
    flag: Arc<Flag>,
    waker: Waker,
}

impl Latch {
    /// A latch whose first poll goes through.
    pub fn new() -> Latch {
        let flag = Arc::new(Flag {
            fired: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        Latch {
            waker: Waker::from(flag.clone()),
            flag,
        }
    }

    /// The next poll goes through.
    #[inline]
    pub fn rearm(&self) {
        self.flag.fired.store(true, Ordering::Release);
    }

    /// Runs `poll` with the latch's waker if the latch fired (or was re-armed) since the last
    /// poll that went through; `Pending` otherwise.
    #[inline]
    pub fn poll<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        // The task's waker is kept current first, so a wake racing with this poll reaches it.
        {
            let mut task = match self.flag.task.lock() {
                Ok(t) => t,
                Err(p) => p.into_inner(),
            };
            match task.as_ref() {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *task = Some(cx.waker().clone()),
            }
        }
        if !self.flag.fired.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        poll(&mut Context::from_waker(&self.waker))
    }

    /// [`Latch::poll`] of a source that may be ready again right after it was (a socket
    /// read): after `Ready` the next poll goes through too, so only a `Pending` (which left
    /// the latch's waker with the source) closes the latch.
    #[inline]
    pub fn poll_source<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let r = self.poll(cx, poll);
        if r.is_ready() {
            self.rearm();
        }
        r
    }
}

impl Default for Latch {
    fn default() -> Self {
        Latch::new()
    }
}

/// `F` polled only when its waker fired since its last poll, or after [`Gate::rearm`].
pub struct Gate<F> {
    inner: Pin<Box<F>>,
    latch: Latch,
}

impl<F: Future> Gate<F> {
    /// Gates `inner`; its first poll goes through.
    pub fn new(inner: F) -> Gate<F> {
        Gate {
            inner: Box::pin(inner),
            latch: Latch::new(),
        }
    }

    /// The gated future, to change it (reset a timer); call [`Gate::rearm`] after a change
    /// that needs a poll to take effect.
    pub fn inner(&mut self) -> Pin<&mut F> {
        self.inner.as_mut()
    }

    /// The next poll goes through to the inner future.
    pub fn rearm(&mut self) {
        self.latch.rearm();
    }

    /// Polls the inner future if it asked to be polled; `Pending` otherwise.
    pub fn poll_gated(&mut self, cx: &mut Context<'_>) -> Poll<F::Output> {
        let inner = &mut self.inner;
        self.latch.poll(cx, |cx| inner.as_mut().poll(cx))
    }

    /// A future for one poll of the gate (for a `select!` branch).
    pub fn wait(&mut self) -> Wait<'_, F> {
        Wait { gate: self }
    }
}

/// One wait on a [`Gate`].
pub struct Wait<'a, F> {
    gate: &'a mut Gate<F>,
}

impl<F: Future> Future for Wait<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.get_mut().gate.poll_gated(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once `ready` is set, and keeps the last waker it was given.
    struct Probe {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            if self.ready.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    struct CountWake(AtomicUsize);
    impl Wake for CountWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn polls_only_when_woken_or_rearmed_and_wakes_the_task() {
        let polls = Arc::new(AtomicUsize::new(0));
        let ready = Arc::new(AtomicBool::new(false));
        let inner_waker = Arc::new(Mutex::new(None::<Waker>));
        let mut gate = Gate::new(Probe {
            polls: polls.clone(),
            ready: ready.clone(),
            waker: inner_waker.clone(),
        });
        let task = Arc::new(CountWake(AtomicUsize::new(0)));
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);

        assert!(gate.poll_gated(&mut cx).is_pending());
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "the first poll goes through"
        );
        for _ in 0..5 {
            assert!(gate.poll_gated(&mut cx).is_pending());
        }
        assert_eq!(
            polls.load(Ordering::SeqCst),
            1,
            "not woken: not polled again"
        );

        // The inner future's waker fires: the task is woken and the next poll goes through.
        let w = inner_waker.lock().unwrap().clone().unwrap();
        w.wake_by_ref();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert!(gate.poll_gated(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert!(gate.poll_gated(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);

        // Re-armed (a timer reset): polled once more.
        gate.rearm();
        assert!(gate.poll_gated(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 3);

        // Ready only reaches the caller through a poll that was let through.
        ready.store(true, Ordering::SeqCst);
        assert!(
            gate.poll_gated(&mut cx).is_pending(),
            "ready but not woken yet"
        );
        w.wake_by_ref();
        assert!(gate.poll_gated(&mut cx).is_ready());
    }

    #[test]
    fn a_new_task_waker_is_the_one_woken() {
        let ready = Arc::new(AtomicBool::new(false));
        let inner_waker = Arc::new(Mutex::new(None::<Waker>));
        let mut gate = Gate::new(Probe {
            polls: Arc::new(AtomicUsize::new(0)),
            ready,
            waker: inner_waker.clone(),
        });
        let first = Arc::new(CountWake(AtomicUsize::new(0)));
        let second = Arc::new(CountWake(AtomicUsize::new(0)));
        let (w1, w2) = (Waker::from(first.clone()), Waker::from(second.clone()));
        assert!(gate.poll_gated(&mut Context::from_waker(&w1)).is_pending());
        // Moved to another task (or executor): the gate now wakes that one.
        assert!(gate.poll_gated(&mut Context::from_waker(&w2)).is_pending());
        inner_waker.lock().unwrap().clone().unwrap().wake_by_ref();
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_source_latch_stays_open_after_ready_and_closes_on_pending() {
        let task = Arc::new(CountWake(AtomicUsize::new(0)));
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let mut latch = Latch::new();
        let polls = AtomicUsize::new(0);
        let mut kept = None::<Waker>;
        // (what the source answers, whether the poll should reach it)
        let table = [
            (Poll::Ready(1), true),  // first poll goes through
            (Poll::Ready(2), true),  // ready: may be ready again
            (Poll::Pending, true),   // found nothing: the latch closes
            (Poll::Ready(3), false), // not signalled: not asked
            (Poll::Ready(3), false),
        ];
        for (i, (answer, reaches)) in table.into_iter().enumerate() {
            let before = polls.load(Ordering::SeqCst);
            let r = latch.poll_source(&mut cx, |inner| {
                polls.fetch_add(1, Ordering::SeqCst);
                kept = Some(inner.waker().clone());
                answer
            });
            let reached = polls.load(Ordering::SeqCst) > before;
            assert_eq!(reached, reaches, "step {i}");
            if reaches {
                assert_eq!(r, answer, "step {i}");
            } else {
                assert!(r.is_pending(), "step {i}");
            }
        }
        // The source signals through the waker it kept: the task is woken, the next poll reaches it.
        kept.take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            latch.poll_source(&mut cx, |_| Poll::Ready(4)),
            Poll::Ready(4)
        );
    }
}
