//! The FIFO of expected responses, with the count of error-mode barriers in it kept as it
//! changes, so asking "is anything holding the outbox back?" never rescans the queue (a
//! Query of 50 000 statements would make that quadratic).

use std::collections::VecDeque;

use super::Pending;

#[derive(Default)]
pub(super) struct Fifo {
    q: VecDeque<Pending>,
    barriers: usize,
}

impl Fifo {
    pub fn barriers(&self) -> usize {
        self.barriers
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    pub fn front(&self) -> Option<&Pending> {
        self.q.front()
    }

    /// The front entry, to update its statement's counts (never its barrier flag: use
    /// [`Fifo::lift_front_barrier`]).
    pub fn front_mut(&mut self) -> Option<&mut Pending> {
        self.q.front_mut()
    }

    /// The first `n` entries, front first (their statements' counts may change; never a
    /// barrier flag).
    pub fn first_mut(&mut self, n: usize) -> impl Iterator<Item = &mut Pending> {
        self.q.iter_mut().take(n)
    }

    pub fn push_back(&mut self, p: Pending) {
        self.barriers += usize::from(p.is_barrier());
        self.q.push_back(p);
    }

    pub fn push_front(&mut self, p: Pending) {
        self.barriers += usize::from(p.is_barrier());
        self.q.push_front(p);
    }

    pub fn pop_front(&mut self) -> Option<Pending> {
        let p = self.q.pop_front()?;
        self.barriers -= usize::from(p.is_barrier());
        Some(p)
    }

    /// The front Execute no longer holds the outbox back (a COPY FROM STDIN needs the
    /// client's data to get to its result).
    pub fn lift_front_barrier(&mut self) {
        if let Some(Pending::Execute { barrier, .. }) = self.q.front_mut() {
            if *barrier {
                *barrier = false;
                self.barriers -= 1;
            }
        }
    }

    /// Drops the Syncs behind the front that match `ignored` (the server will never answer
    /// them); returns how many went.
    pub fn drop_syncs(&mut self, ignored: impl Fn(&Pending) -> bool) -> usize {
        let before = self.q.len();
        let mut first = true;
        self.q.retain(|p| {
            let keep = first || !ignored(p);
            first = false;
            keep
        });
        before - self.q.len()
    }
}
