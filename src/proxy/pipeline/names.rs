//! Prepared statements and portals as the server holds them. A Parse, Bind or Close only
//! changes a name once the server has answered it (ParseComplete, BindComplete,
//! CloseComplete); until then the change is pending. An error discards the pending change of
//! the failed message and of every message the server skipped after it, so the gateway never
//! believes in a definition the server refused (a second Parse of a name that exists is
//! refused by the server: the first text stays bound).
//!
//! Messages are grouped by the client's Sync (or Query, or FunctionCall): inside one group,
//! a message after a failed one is skipped by the server, so a pending change of the same
//! group can be relied on. A message that needs a name with a pending change from an earlier
//! group must wait for that answer ([`Lookup::Wait`]).

use std::collections::{HashMap, VecDeque};

/// What a name is bound to, in bytes held by the gateway.
pub(super) trait Weight {
    /// Bytes held for this value (its name excluded).
    fn weight(&self) -> usize;
}

/// A name's state as the server will see it at the next message of the current group.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Lookup<'a, V> {
    /// Defined with this value.
    Defined(&'a V),
    /// Not defined.
    Undefined,
    /// Depends on an answer still to come from an earlier group.
    Wait,
}

impl<V> Lookup<'_, V> {
    /// The answer it depends on has not come yet.
    pub fn is_wait(&self) -> bool {
        matches!(self, Lookup::Wait)
    }
}

/// Statements or portals of one session. The unnamed one (most drivers use only it) has
/// slots of its own: no hashing on the common path.
pub(super) struct Names<V> {
    confirmed: HashMap<Vec<u8>, V>,
    /// The confirmed unnamed entry.
    unnamed: Option<V>,
    /// Changes not answered yet, per name, oldest first (the unnamed one's apart).
    pending: HashMap<Vec<u8>, VecDeque<Proposed<V>>>,
    unnamed_pending: VecDeque<Proposed<V>>,
    /// Changes in `pending`, all names together.
    pending_count: usize,
    /// The group of the latest change proposed, and how many changes of that group are
    /// still pending (groups only grow: any other pending change is from an earlier one).
    latest_group: (u64, usize),
    /// Bytes of names and values in `confirmed` and `pending`.
    bytes: usize,
    /// Confirmed entries that a pending Close will free (entries, bytes): already counted
    /// as free for the limits, so a client that closes one can define another at once.
    releasing: (usize, usize),
}

struct Proposed<V> {
    /// The group it was sent in.
    group: u64,
    /// Defined as this, or closed (None).
    value: Option<V>,
    /// Bytes of a confirmed entry this Close frees (0: frees nothing confirmed).
    frees: usize,
}

impl<V: Weight> Names<V> {
    /// Nothing defined.
    pub fn new() -> Names<V> {
        Names {
            confirmed: HashMap::new(),
            unnamed: None,
            pending: HashMap::new(),
            unnamed_pending: VecDeque::new(),
            pending_count: 0,
            latest_group: (0, 0),
            bytes: 0,
            releasing: (0, 0),
        }
    }

    /// A name whose confirmed or proposed value satisfies `pred` (a scan: only for the
    /// rare server error that names a backend name).
    pub fn name_where(&self, pred: impl Fn(&V) -> bool) -> Option<&[u8]> {
        let confirmed = self.confirmed.iter().find(|(_, v)| pred(v));
        let confirmed = confirmed.map(|(k, _)| k.as_slice());
        confirmed.or_else(|| {
            self.pending
                .iter()
                .find(|(_, q)| q.iter().any(|p| p.value.as_ref().is_some_and(&pred)))
                .map(|(k, _)| k.as_slice())
        })
    }

    /// The state of `name` for a message of group `group`.
    pub fn lookup(&self, name: &[u8], group: u64) -> Lookup<'_, V> {
        if let Some(q) = self.pending_of(name) {
            if let Some(p) = q.back() {
                if p.group != group {
                    return Lookup::Wait;
                }
                return match &p.value {
                    Some(v) => Lookup::Defined(v),
                    None => Lookup::Undefined,
                };
            }
        }
        match self.confirmed_of(name) {
            Some(v) => Lookup::Defined(v),
            None => Lookup::Undefined,
        }
    }

    /// Whether a change sent before `group` is still unanswered: only then may a lookup
    /// for `group` have to wait (checked before any message is parsed for its names).
    pub fn waits_before(&self, group: u64) -> bool {
        let current = match self.latest_group {
            (g, n) if g == group => n,
            _ => 0,
        };
        self.pending_count > current
    }

    fn pending_of(&self, name: &[u8]) -> Option<&VecDeque<Proposed<V>>> {
        if name.is_empty() {
            return Some(&self.unnamed_pending);
        }
        if self.pending.is_empty() {
            return None;
        }
        self.pending.get(name)
    }

    fn confirmed_of(&self, name: &[u8]) -> Option<&V> {
        if name.is_empty() {
            return self.unnamed.as_ref();
        }
        self.confirmed.get(name)
    }

    fn confirmed_remove(&mut self, name: &[u8]) -> Option<V> {
        if name.is_empty() {
            return self.unnamed.take();
        }
        self.confirmed.remove(name)
    }

    /// Entries held (confirmed and pending, less those being closed), for the limit.
    pub fn len(&self) -> usize {
        (self.confirmed.len() + usize::from(self.unnamed.is_some()) + self.pending_count)
            .saturating_sub(self.releasing.0)
    }

    /// Bytes held (less those being closed), for the tracking limit.
    pub fn bytes(&self) -> usize {
        self.bytes.saturating_sub(self.releasing.1)
    }

    /// A change sent to the server in `group`: defined as `value`, or closed (None).
    pub fn propose(&mut self, name: &[u8], value: Option<V>, group: u64) {
        self.bytes += name.len() + value.as_ref().map_or(0, Weight::weight);
        self.pending_count += 1;
        match &mut self.latest_group {
            (g, n) if *g == group => *n += 1,
            latest => *latest = (group, 1),
        }
        let confirmed = if name.is_empty() {
            self.unnamed.as_ref()
        } else {
            self.confirmed.get(name)
        };
        let queue = if name.is_empty() {
            &mut self.unnamed_pending
        } else {
            self.pending.entry(name.to_vec()).or_default()
        };
        // A Close of a confirmed entry with nothing else pending frees it (and itself).
        let frees = match (&value, queue.is_empty(), confirmed) {
            (None, true, Some(old)) => 2 * name.len() + old.weight(),
            _ => 0,
        };
        if frees > 0 {
            self.releasing.0 += 2;
            self.releasing.1 += frees;
        }
        queue.push_back(Proposed {
            group,
            value,
            frees,
        });
    }

    /// The server answered the oldest pending change of `name`: it takes effect. Returns
    /// the confirmed value it replaced or closed (its parts may be reused).
    pub fn confirm(&mut self, name: &[u8]) -> Option<V> {
        let Proposed { value: change, .. } = self.take_oldest(name)?;
        let old = self.confirmed_remove(name);
        if let Some(old) = &old {
            self.bytes = self.bytes.saturating_sub(name.len() + old.weight());
        }
        match change {
            // Its bytes were counted when proposed.
            Some(v) if name.is_empty() => self.unnamed = Some(v),
            Some(v) => {
                self.confirmed.insert(name.to_vec(), v);
            }
            None => self.bytes = self.bytes.saturating_sub(name.len()),
        }
        old
    }

    /// The server failed or skipped the oldest pending change of `name`: it never happens.
    pub fn discard(&mut self, name: &[u8]) {
        if let Some(Proposed { value: change, .. }) = self.take_oldest(name) {
            self.bytes = self
                .bytes
                .saturating_sub(name.len() + change.as_ref().map_or(0, Weight::weight));
        }
    }

    fn take_oldest(&mut self, name: &[u8]) -> Option<Proposed<V>> {
        let oldest = if name.is_empty() {
            self.unnamed_pending.pop_front()
        } else {
            let q = self.pending.get_mut(name)?;
            let oldest = q.pop_front();
            if q.is_empty() {
                self.pending.remove(name);
            }
            oldest
        };
        if let Some(p) = &oldest {
            self.pending_count -= 1;
            if p.group == self.latest_group.0 {
                self.latest_group.1 -= 1;
            }
            if p.frees > 0 {
                self.releasing.0 -= 2;
                self.releasing.1 -= p.frees;
            }
        }
        oldest
    }

    /// The confirmed entry of `name`, when no change of it is pending (so what the server
    /// answers now is about this very entry).
    pub fn settled_mut(&mut self, name: &[u8]) -> Option<&mut V> {
        if self.pending_of(name).is_some_and(|q| !q.is_empty()) {
            return None;
        }
        if name.is_empty() {
            return self.unnamed.as_mut();
        }
        self.confirmed.get_mut(name)
    }

    /// Forget every confirmed entry (portals at the end of a transaction), each handed to
    /// `forgotten` (its parts may be reused).
    pub fn clear_confirmed(&mut self, mut forgotten: impl FnMut(V)) {
        if let Some(v) = self.unnamed.take() {
            self.bytes = self.bytes.saturating_sub(v.weight());
            forgotten(v);
        }
        if self.confirmed.is_empty() {
            // Draining resets every bucket of the table: a map that once held many names
            // would make each idle ReadyForQuery cost its capacity.
            return;
        }
        for (name, v) in self.confirmed.drain() {
            self.bytes = self.bytes.saturating_sub(name.len() + v.weight());
            forgotten(v);
        }
    }
}

impl Weight for std::sync::Arc<str> {
    fn weight(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn text(v: Lookup<'_, Arc<str>>) -> String {
        match v {
            Lookup::Defined(t) => t.to_string(),
            Lookup::Undefined => "-".into(),
            Lookup::Wait => "wait".into(),
        }
    }

    #[test]
    fn changes_take_effect_only_when_answered() {
        // The unnamed entry has slots of its own: the same rules hold for it.
        for name in [&b"s"[..], b""] {
            changes_of(name);
        }
    }

    fn changes_of(s: &[u8]) {
        // (step, expected lookup of "s" in group 2 afterwards)
        let mut n: Names<Arc<str>> = Names::new();
        assert_eq!(text(n.lookup(s, 0)), "-");
        n.propose(s, Some(Arc::from("write")), 0);
        // Same group: relied on (a failure would skip the later message too).
        assert_eq!(text(n.lookup(s, 0)), "write");
        // A later group must wait for the answer.
        assert_eq!(text(n.lookup(s, 1)), "wait");
        n.confirm(s);
        assert_eq!(text(n.lookup(s, 1)), "write");
        // The server refuses a second Parse of a defined name: the gateway proposes nothing,
        // and a refused change is discarded, never applied.
        n.propose(s, Some(Arc::from("read")), 1);
        n.discard(s);
        assert_eq!(text(n.lookup(s, 2)), "write");
        n.propose(s, None, 2);
        assert_eq!(text(n.lookup(s, 2)), "-");
        n.confirm(s);
        assert_eq!(text(n.lookup(s, 3)), "-");
        assert_eq!(n.len(), 0);
        assert_eq!(n.bytes(), 0);
    }

    #[test]
    fn only_an_unanswered_change_of_an_earlier_group_can_make_a_lookup_wait() {
        let mut n: Names<Arc<str>> = Names::new();
        assert!(!n.waits_before(0));
        n.propose(b"a", Some(Arc::from("1")), 0);
        n.propose(b"", Some(Arc::from("2")), 0);
        // Same group: relied on, nothing to wait for.
        assert!(!n.waits_before(0));
        assert!(n.waits_before(1));
        assert!(n.lookup(b"a", 1).is_wait());
        n.propose(b"b", Some(Arc::from("3")), 1);
        assert!(n.waits_before(1));
        n.confirm(b"a");
        assert!(n.waits_before(1));
        n.discard(b"");
        // Only group 1's own change is left.
        assert!(!n.waits_before(1));
        assert!(!n.lookup(b"b", 1).is_wait());
        assert!(n.waits_before(2));
        n.confirm(b"b");
        assert!(!n.waits_before(2));
    }

    #[test]
    fn bytes_and_counts_follow_every_path() {
        let mut n: Names<Arc<str>> = Names::new();
        n.propose(b"a", Some(Arc::from("12345")), 0);
        n.propose(b"b", Some(Arc::from("123")), 0);
        assert_eq!((n.len(), n.bytes()), (2, 6 + 4));
        n.confirm(b"a");
        n.discard(b"b");
        assert_eq!((n.len(), n.bytes()), (1, 6));
        n.propose(b"a", Some(Arc::from("1")), 1);
        n.confirm(b"a");
        assert_eq!((n.len(), n.bytes()), (1, 2));
        n.clear_confirmed(drop);
        assert_eq!((n.len(), n.bytes()), (0, 0));
        // A Close of a confirmed entry frees its room at once, and gives it back if refused.
        n.propose(b"c", Some(Arc::from("123")), 2);
        n.confirm(b"c");
        assert_eq!((n.len(), n.bytes()), (1, 4));
        n.propose(b"c", None, 3);
        assert_eq!((n.len(), n.bytes()), (0, 0));
        n.discard(b"c");
        assert_eq!((n.len(), n.bytes()), (1, 4));
        n.propose(b"c", None, 4);
        n.confirm(b"c");
        assert_eq!((n.len(), n.bytes()), (0, 0));
        // Answers for names never proposed are ignored.
        n.confirm(b"zz");
        n.discard(b"zz");
        assert_eq!((n.len(), n.bytes()), (0, 0));
    }
}
