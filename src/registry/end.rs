//! The recorded end of a token: `ending` (review not stored yet) → `reviewed` (or
//! `discarded` by an operator) → `destroyed`. Each step is written to the token's record
//! before the next begins, so a gateway killed anywhere in between picks the end up where it
//! stopped (the janitor finishes tokens still `ending`). Pure transitions, plus the named
//! points a test can crash the gateway at.

use serde::{Deserialize, Serialize};

use super::{TokenRecord, TokenState};

/// How far the end of an ended token has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndPhase {
    /// Ended; its review is not stored yet (the backend is kept for it).
    Ending,
    /// Its review is stored; the backend may go.
    Reviewed,
    /// An operator discarded the scratch data without a stored review; the backend may go.
    Discarded,
    /// Its backend is destroyed.
    Destroyed,
}

impl EndPhase {
    /// The one spelling of a phase.
    pub fn as_str(self) -> &'static str {
        match self {
            EndPhase::Ending => "ending",
            EndPhase::Reviewed => "reviewed",
            EndPhase::Discarded => "discarded",
            EndPhase::Destroyed => "destroyed",
        }
    }
}

/// What happened at the end of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndEvent {
    /// The review was stored.
    ReviewStored,
    /// Taking or storing the review failed, for this reason.
    ReviewFailed(String),
    /// An operator discarded the scratch data.
    Discard,
    /// The backend was destroyed.
    Destroyed,
}

/// A step the end of a token does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndError {
    #[error("the token has not ended")]
    NotEnded,
    #[error("the token's end is {0}: {1}")]
    Refused(&'static str, &'static str),
}

/// The phase after `event` in `phase` (None: the token has not ended).
pub fn step(phase: Option<EndPhase>, event: &EndEvent) -> Result<EndPhase, EndError> {
    use EndEvent as E;
    use EndPhase as P;
    let Some(phase) = phase else {
        return Err(EndError::NotEnded);
    };
    match (phase, event) {
        (P::Ending, E::ReviewStored) => Ok(P::Reviewed),
        (P::Ending, E::ReviewFailed(_)) => Ok(P::Ending),
        (P::Ending, E::Discard) => Ok(P::Discarded),
        (P::Discarded, E::Discard) => Ok(P::Discarded),
        (P::Reviewed | P::Discarded | P::Destroyed, E::Destroyed) => Ok(P::Destroyed),
        (P::Ending, E::Destroyed) => Err(EndError::Refused(
            "ending",
            "its backend is kept until its review is stored or discarded",
        )),
        (P::Reviewed | P::Destroyed, E::Discard) => Err(EndError::Refused(
            phase.as_str(),
            "there is no scratch data waiting for a review",
        )),
        (P::Discarded | P::Destroyed, E::ReviewStored | E::ReviewFailed(_)) => Err(
            EndError::Refused(phase.as_str(), "there is no scratch data to review"),
        ),
        (P::Reviewed, E::ReviewStored | E::ReviewFailed(_)) => Err(EndError::Refused(
            "reviewed",
            "its review is stored already",
        )),
    }
}

/// Applies `event` to a record: its phase, and the review failure it carries (set by a
/// failure, cleared by a stored review, given a reason by a discard before any try).
pub fn apply(rec: &mut TokenRecord, event: &EndEvent) -> Result<(), EndError> {
    let next = step(rec.end, event)?;
    match event {
        EndEvent::ReviewStored => rec.review_error = None,
        EndEvent::ReviewFailed(why) => rec.review_error = Some(why.clone()),
        EndEvent::Discard if rec.review_error.is_none() => {
            rec.review_error = Some("discarded by an operator before a review was stored".into())
        }
        _ => {}
    }
    rec.end = Some(next);
    Ok(())
}

/// Marks a usable token ended (`state` must be expired or revoked): its end begins.
pub fn begin(rec: &mut TokenRecord, state: TokenState) {
    rec.state = state;
    rec.end = Some(EndPhase::Ending);
}

/// Whether the backend of an ended token may be destroyed now. Records of tokens ended
/// before ends were recorded (no phase) may.
pub fn may_destroy(rec: &TokenRecord) -> bool {
    !rec.state.is_usable() && rec.end != Some(EndPhase::Ending)
}

/// Whether an ended token still waits for its review (the janitor retries it).
pub fn needs_review(rec: &TokenRecord) -> bool {
    !rec.state.is_usable() && rec.end == Some(EndPhase::Ending)
}

/// What a person is told about the review of a token: None while it is usable (or ended
/// before ends were recorded), else `stored`, `pending` or `failed: <reason>`.
pub fn review_status(rec: &TokenRecord) -> Option<String> {
    if rec.state.is_usable() {
        return None;
    }
    match (rec.end?, &rec.review_error) {
        (_, Some(why)) => Some(format!("failed: {why}")),
        (EndPhase::Ending, None) => Some("pending".into()),
        (_, None) => Some("stored".into()),
    }
}

/// Why approving this token must be refused (its review failed or is not stored yet).
pub fn approval_refused(rec: &TokenRecord) -> Option<String> {
    match review_status(rec)?.as_str() {
        "stored" => None,
        "pending" => Some("review pending: the end-of-token review is not stored yet".into()),
        s => Some(format!("review {s}")),
    }
}

/// Environment variable naming a step at which the gateway kills itself with SIGKILL (for
/// the crash tests of the end of a token; never set in production).
pub const CRASH_AT_ENV: &str = "SANDPIT_TEST_CRASH_AT";

/// The gateway dies here (SIGKILL, no cleanup) when [`CRASH_AT_ENV`] names this step.
pub fn crash_point(step: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var(CRASH_AT_ENV).ok());
    if at.as_deref() == Some(step) {
        tracing::error!(step, "{CRASH_AT_ENV}: killing the gateway here");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EndEvent as E;
    use EndPhase as P;

    #[test]
    fn transitions() {
        let failed = E::ReviewFailed("lock timeout".into());
        let table: &[(Option<P>, E, Result<P, ()>)] = &[
            (None, E::ReviewStored, Err(())),
            (None, E::Discard, Err(())),
            (None, E::Destroyed, Err(())),
            (Some(P::Ending), E::ReviewStored, Ok(P::Reviewed)),
            (Some(P::Ending), failed.clone(), Ok(P::Ending)),
            (Some(P::Ending), E::Discard, Ok(P::Discarded)),
            (Some(P::Ending), E::Destroyed, Err(())),
            (Some(P::Reviewed), E::ReviewStored, Err(())),
            (Some(P::Reviewed), failed.clone(), Err(())),
            (Some(P::Reviewed), E::Discard, Err(())),
            (Some(P::Reviewed), E::Destroyed, Ok(P::Destroyed)),
            (Some(P::Discarded), E::ReviewStored, Err(())),
            (Some(P::Discarded), E::Discard, Ok(P::Discarded)),
            (Some(P::Discarded), E::Destroyed, Ok(P::Destroyed)),
            (Some(P::Destroyed), E::Destroyed, Ok(P::Destroyed)),
            (Some(P::Destroyed), E::Discard, Err(())),
            (Some(P::Destroyed), failed.clone(), Err(())),
        ];
        for (from, ev, want) in table {
            let got = step(*from, ev).map_err(|_| ());
            assert_eq!(&got, want, "{from:?} + {ev:?}");
        }
    }

    fn ended(end: Option<P>, err: Option<&str>) -> TokenRecord {
        let mut r = TokenRecord::for_tests("t1");
        r.state = TokenState::Revoked;
        r.end = end;
        r.review_error = err.map(str::to_string);
        r
    }

    #[test]
    fn what_a_person_is_told_and_what_may_be_destroyed() {
        let live = TokenRecord::for_tests("t1");
        let cases: &[(TokenRecord, Option<&str>, bool, bool)] = &[
            // record, status, may destroy, approval refused
            (live, None, false, false),
            (ended(None, None), None, true, false),
            (ended(Some(P::Ending), None), Some("pending"), false, true),
            (
                ended(Some(P::Ending), Some("lock timeout")),
                Some("failed: lock timeout"),
                false,
                true,
            ),
            (ended(Some(P::Reviewed), None), Some("stored"), true, false),
            (ended(Some(P::Destroyed), None), Some("stored"), true, false),
            (
                ended(Some(P::Discarded), Some("x")),
                Some("failed: x"),
                true,
                true,
            ),
            (
                ended(Some(P::Destroyed), Some("x")),
                Some("failed: x"),
                true,
                true,
            ),
        ];
        for (rec, status, destroy, refused) in cases {
            assert_eq!(review_status(rec).as_deref(), *status, "{rec:?}");
            assert_eq!(may_destroy(rec), *destroy, "{rec:?}");
            assert_eq!(approval_refused(rec).is_some(), *refused, "{rec:?}");
        }
        assert_eq!(
            approval_refused(&ended(Some(P::Ending), Some("lock timeout"))).as_deref(),
            Some("review failed: lock timeout")
        );
    }

    #[test]
    fn a_failure_is_kept_until_a_review_is_stored_and_a_discard_says_why() {
        let mut r = ended(Some(P::Ending), None);
        apply(&mut r, &E::ReviewFailed("boom".into())).unwrap();
        assert_eq!(
            (r.end, r.review_error.as_deref()),
            (Some(P::Ending), Some("boom"))
        );
        apply(&mut r, &E::ReviewStored).unwrap();
        assert_eq!(
            (r.end, r.review_error.as_deref()),
            (Some(P::Reviewed), None)
        );
        let mut d = ended(Some(P::Ending), None);
        apply(&mut d, &E::Discard).unwrap();
        assert!(d.review_error.unwrap().contains("discarded"));
        let mut live = TokenRecord::for_tests("t1");
        assert_eq!(apply(&mut live, &E::Discard), Err(EndError::NotEnded));
        begin(&mut live, TokenState::Expired);
        assert_eq!(live.end, Some(P::Ending));
    }
}
