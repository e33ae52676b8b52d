//! Bytes the client is sent that are not results: notices and notifications. They count
//! against the token's `max_bytes` like rows do, per stretch between two ReadyForQuery
//! messages (a `DO` loop raising notices is one statement; notifications of a transaction
//! arrive after its last result and before ReadyForQuery). Past the budget they are
//! dropped, and the client gets one notice saying how many, just before the
//! ReadyForQuery that ends the stretch.

use bytes::Bytes;

use crate::wire::messages;

/// What one stretch has sent and dropped so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Chatter {
    /// Bytes of notices and notifications relayed in this stretch.
    sent: u64,
    dropped_notices: u64,
    dropped_notifications: u64,
    dropped_bytes: u64,
}

/// Which kind of message is asking to be relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Noise {
    /// NoticeResponse (`N`).
    Notice,
    /// NotificationResponse (`A`).
    Notification,
}

impl Chatter {
    /// Whether a message of `len` bytes may still reach the client under `max_bytes`;
    /// counted either way.
    pub fn admit(&mut self, noise: Noise, len: usize, max_bytes: u64) -> bool {
        let len = len as u64;
        if self.sent.saturating_add(len) <= max_bytes {
            self.sent += len;
            return true;
        }
        match noise {
            Noise::Notice => self.dropped_notices += 1,
            Noise::Notification => self.dropped_notifications += 1,
        }
        self.dropped_bytes = self.dropped_bytes.saturating_add(len);
        false
    }

    /// The stretch ends (ReadyForQuery): the notice to send before it when anything was
    /// dropped, and a fresh budget.
    pub fn end(&mut self, max_bytes: u64) -> Option<Bytes> {
        let done = std::mem::take(self);
        if done.dropped_notices == 0 && done.dropped_notifications == 0 {
            return None;
        }
        Some(messages::notice_response(
            "NOTICE",
            "01000",
            &format!(
                "sandpit: {} notices and {} notifications ({} bytes) were not sent because this \
                 statement's notices and notifications reached max_bytes ({max_bytes} bytes)",
                done.dropped_notices, done.dropped_notifications, done.dropped_bytes
            ),
        ))
    }

    /// Anything dropped in this stretch so far.
    pub fn dropped(&self) -> u64 {
        self.dropped_notices + self.dropped_notifications
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages (kind, len) in order, the budget, which were admitted, and how many notices
    /// and notifications were dropped.
    type Case = (&'static [(Noise, usize)], u64, &'static [bool], (u64, u64));

    #[test]
    fn budget_table() {
        let cases: &[Case] = &[
            (&[], 10, &[], (0, 0)),
            (
                &[(Noise::Notice, 4), (Noise::Notice, 6)],
                10,
                &[true, true],
                (0, 0),
            ),
            (
                &[
                    (Noise::Notice, 4),
                    (Noise::Notification, 7),
                    (Noise::Notice, 6),
                ],
                10,
                &[true, false, true],
                (0, 1),
            ),
            (
                &[
                    (Noise::Notice, 11),
                    (Noise::Notice, 1),
                    (Noise::Notification, 1),
                ],
                10,
                &[false, true, true],
                (1, 0),
            ),
            (&[(Noise::Notice, 1); 3], 0, &[false, false, false], (3, 0)),
            (
                &[(Noise::Notification, usize::MAX)],
                u64::MAX - 1,
                &[false],
                (0, 1),
            ),
        ];
        for (i, (msgs, max, admitted, (notices, notifications))) in cases.iter().enumerate() {
            let mut c = Chatter::default();
            let got: Vec<bool> = msgs.iter().map(|&(n, l)| c.admit(n, l, *max)).collect();
            assert_eq!(&got[..], *admitted, "case {i}");
            assert_eq!(c.dropped_notices, *notices, "case {i}");
            assert_eq!(c.dropped_notifications, *notifications, "case {i}");
            let summary = c.end(*max);
            assert_eq!(summary.is_some(), notices + notifications > 0, "case {i}");
            assert_eq!(
                c,
                Chatter::default(),
                "case {i}: a new stretch starts empty"
            );
        }
    }

    #[test]
    fn summary_names_the_counts() {
        let mut c = Chatter::default();
        assert!(c.admit(Noise::Notice, 8, 10));
        assert!(!c.admit(Noise::Notice, 8, 10));
        assert!(!c.admit(Noise::Notification, 5, 10));
        let n = c.end(10).expect("something was dropped");
        let text = String::from_utf8_lossy(&n);
        assert!(
            text.contains("1 notices and 1 notifications (13 bytes)"),
            "{text}"
        );
        assert!(text.contains("01000"));
    }
}
