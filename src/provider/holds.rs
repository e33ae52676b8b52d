//! Backends held by this process's reviews, which the janitor must leave alone: verification
//! forks (their tag names no token of the registry) and the scratch database of a token whose
//! end-of-token review runs. Process-wide because the janitor and the review share nothing
//! else; whoever holds a backend destroys it when done.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Backends a review is using now, with how many holds each: verification forks (their
/// tag names no token of the registry) and the scratch database of a token whose
/// end-of-token review runs (its token is already revoked or expired). The janitor leaves
/// them alone; whoever holds one destroys it when done.
static IN_FLIGHT: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

/// Whether a review of this process is using `handle` (a backend handle or a tag's token id).
pub fn in_flight(handle: &str) -> bool {
    IN_FLIGHT
        .lock()
        .map(|s| s.contains_key(handle))
        .unwrap_or(false)
}

/// A hold on a backend: [`in_flight`] says so until it is dropped (also when the future
/// holding it is cancelled).
pub struct Hold(String);

/// Hold `handle` (see [`Hold`]).
pub fn hold(handle: &str) -> Hold {
    if let Ok(mut s) = IN_FLIGHT.lock() {
        *s.entry(handle.to_string()).or_insert(0) += 1;
    }
    Hold(handle.to_string())
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Ok(mut s) = IN_FLIGHT.lock() {
            if let Some(n) = s.get_mut(&self.0) {
                *n -= 1;
                if *n == 0 {
                    s.remove(&self.0);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_counted_and_released_on_drop() {
        let a = hold("sp_testhandle");
        let b = hold("sp_testhandle");
        assert!(in_flight("sp_testhandle"));
        drop(a);
        assert!(in_flight("sp_testhandle"));
        drop(b);
        assert!(!in_flight("sp_testhandle"));
    }
}
