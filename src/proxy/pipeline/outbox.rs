//! What waits to go to the backend: messages in order, each with the responses it will
//! cause. Nothing here allocates per message once the session is warm: the expected
//! responses of all messages share one queue, and the messages the gateway writes itself
//! (the unnamed Parse/Bind/Describe/Execute runs) are written into one reused buffer.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::Pending;

/// A built buffer that grew past this is given back once drained (a Query of many
/// statements must not leave its size held by the session for good).
const KEEP_BUILT: usize = 64 * 1024;

/// The bytes of one queued message (or run of messages).
enum Payload {
    /// Bytes as read from the client, or built apart (shared, not copied).
    Shared(Bytes),
    /// The next this many bytes of `Outbox::built`.
    Built(usize),
}

struct Queued {
    payload: Payload,
    /// Its entries at the front of `Outbox::pending` (once those before it are gone).
    responses: usize,
}

/// Messages for the backend with the responses they will cause, in order.
#[derive(Default)]
pub(super) struct Outbox {
    queued: VecDeque<Queued>,
    pending: VecDeque<Pending>,
    /// Bytes of the `Built` payloads, in their order, from `built_start` on.
    built: Vec<u8>,
    built_start: usize,
}

/// What one queued message brings when it is taken: its bytes were appended to the
/// caller's buffer, its responses are next in [`Outbox::pop_response`].
pub(super) struct Taken {
    /// How many responses it brings.
    pub responses: usize,
    /// One of them is an error-mode barrier.
    pub barrier: bool,
}

impl Outbox {
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Queue `bytes` with the responses it will cause.
    pub fn push(&mut self, bytes: Bytes, pending: impl IntoIterator<Item = Pending>) {
        let before = self.pending.len();
        self.pending.extend(pending);
        self.queued.push_back(Queued {
            payload: Payload::Shared(bytes),
            responses: self.pending.len() - before,
        });
    }

    /// Queue the bytes `write` appends (to a buffer reused from message to message) with
    /// the responses it returns.
    pub fn push_built<I>(&mut self, write: impl FnOnce(&mut Vec<u8>) -> I)
    where
        I: IntoIterator<Item = Pending>,
    {
        let start = self.built.len();
        let before = self.pending.len();
        let pending = write(&mut self.built);
        self.pending.extend(pending);
        self.queued.push_back(Queued {
            payload: Payload::Built(self.built.len() - start),
            responses: self.pending.len() - before,
        });
    }

    /// The gateway's own statement through the unnamed statement and portal: Parse, Bind,
    /// a Describe when `describe` names the portal's key, Execute(`max_rows`); the client
    /// sees none of the answers but those of `last` (the Execute's entry). Queued last.
    pub fn unnamed_run(
        &mut self,
        sql: &[u8],
        max_rows: i32,
        describe: Option<(Vec<u8>, u64)>,
        last: Pending,
    ) {
        let start = self.built.len();
        let before = self.pending.len();
        let pending = &mut self.pending;
        unnamed_run_into(&mut self.built, sql, max_rows, describe, last, |p| {
            pending.push_back(p)
        });
        self.queued.push_back(Queued {
            payload: Payload::Built(self.built.len() - start),
            responses: self.pending.len() - before,
        });
    }

    /// [`Outbox::unnamed_run`], queued first (ahead of everything waiting).
    pub fn unnamed_run_first(&mut self, sql: &[u8], last: Pending) {
        // A rare path (a cut result in error mode): built apart, then put in front.
        let mut bytes = Vec::new();
        let mut entries = Vec::with_capacity(4);
        unnamed_run_into(&mut bytes, sql, 0, None, last, |p| entries.push(p));
        let responses = entries.len();
        for p in entries.into_iter().rev() {
            self.pending.push_front(p);
        }
        self.queued.push_front(Queued {
            payload: Payload::Shared(Bytes::from(bytes)),
            responses,
        });
    }

    /// Appends the first message's bytes to `to` and tells what responses follow (taken
    /// one by one with [`Outbox::pop_response`]).
    pub fn take(&mut self, to: &mut BytesMut) -> Option<Taken> {
        let q = self.queued.pop_front()?;
        match q.payload {
            Payload::Shared(b) => to.extend_from_slice(&b),
            Payload::Built(n) => {
                let end = self.built_start + n;
                to.extend_from_slice(&self.built[self.built_start..end]);
                self.built_start = end;
                if end == self.built.len() {
                    self.built_start = 0;
                    if self.built.capacity() > KEEP_BUILT {
                        self.built = Vec::new();
                    } else {
                        self.built.clear();
                    }
                }
            }
        }
        let barrier = self
            .pending
            .iter()
            .take(q.responses)
            .any(Pending::is_barrier);
        Some(Taken {
            responses: q.responses,
            barrier,
        })
    }

    /// The next response of a taken message.
    pub fn pop_response(&mut self) -> Option<Pending> {
        self.pending.pop_front()
    }

    /// Drops the queued responses that match `ignored`; returns how many went.
    pub fn drop_responses(&mut self, ignored: impl Fn(&Pending) -> bool) -> usize {
        let mut kept = VecDeque::with_capacity(self.pending.len());
        let mut dropped = 0;
        for q in self.queued.iter_mut() {
            let mut n = 0;
            for _ in 0..q.responses {
                let Some(p) = self.pending.pop_front() else {
                    break;
                };
                if ignored(&p) {
                    dropped += 1;
                } else {
                    kept.push_back(p);
                    n += 1;
                }
            }
            q.responses = n;
        }
        self.pending = kept;
        dropped
    }

    /// Responses queued (tests).
    #[cfg(test)]
    pub fn responses(&self) -> usize {
        self.pending.len()
    }
}

/// Bind of the unnamed statement to the unnamed portal (no parameters, text results).
const BIND_UNNAMED: &[u8] = b"B\0\0\0\x0c\0\0\0\0\0\0\0\0";
/// Describe of the unnamed portal.
const DESCRIBE_UNNAMED_PORTAL: &[u8] = b"D\0\0\0\x06P\0";

/// Writes an unnamed run (see [`Outbox::unnamed_run`]) into `out`, its constant parts as
/// whole slices; gives its responses to `put`, in order (no vector per run).
fn unnamed_run_into(
    out: &mut Vec<u8>,
    sql: &[u8],
    max_rows: i32,
    describe: Option<(Vec<u8>, u64)>,
    last: Pending,
    mut put: impl FnMut(Pending),
) {
    out.reserve(sql.len() + 8 + 1 + BIND_UNNAMED.len() + DESCRIBE_UNNAMED_PORTAL.len() + 10);
    // Parse: unnamed statement, the text, no parameter types.
    out.push(b'P');
    out.extend_from_slice(&((sql.len() + 8) as i32).to_be_bytes());
    out.push(0);
    out.extend_from_slice(sql);
    out.extend_from_slice(&[0, 0, 0]);
    put(Pending::Parse {
        swallow: true,
        change: None,
    });
    out.extend_from_slice(BIND_UNNAMED);
    put(Pending::Bind {
        swallow: true,
        change: None,
    });
    if let Some(key) = describe {
        out.extend_from_slice(DESCRIBE_UNNAMED_PORTAL);
        put(Pending::Describe {
            swallow_nodata: true,
            portal_key: Some(key),
            statement: None,
        });
    }
    // Execute of the unnamed portal.
    let m = max_rows.to_be_bytes();
    out.extend_from_slice(&[b'E', 0, 0, 0, 9, 0, m[0], m[1], m[2], m[3]]);
    put(last);
}

/// Appends a message of `tag` whose body is `parts` one after another.
pub(super) fn put_message(out: &mut Vec<u8>, tag: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.push(tag);
    out.extend_from_slice(&((len as i32 + 4).to_be_bytes()));
    for p in parts {
        out.extend_from_slice(p);
    }
}
