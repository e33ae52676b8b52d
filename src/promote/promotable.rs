//! Whether a captured change can be promoted, decided when its token ends (while the
//! scratch database still runs) so the answer is known before anyone approves: the plan's
//! own refusals (kinds of change not promoted, masked columns written), expressions that
//! would run agent code on the target ([`super::safety`]), written values holding masked
//! ones ([`super::leaks`]), and the review's patch check — "patch verified: differs" means
//! the scratch database holds something the review does not model, so promoting what it
//! does model would not be the change the agent made; a check not made fails closed.

use std::time::Duration;

use super::{leaks, plan, safety};
use crate::pgconn::BackendTarget;
use crate::review::conn::{Side, Timeouts};
use crate::review::model::Review;
use crate::review::model::VerifyStatus;

/// Every reason `review` (the captured change) cannot be promoted; `stored` is the token's
/// stored review (with the patch check), `scratch` the review's login to its scratch
/// database.
pub async fn refusals(
    review: &Review,
    stored: Option<&Review>,
    masked_columns: &[String],
    masked_values: &[String],
    scratch: &BackendTarget,
    timeout: Duration,
) -> Vec<String> {
    let masked: plan::Masked = masked_columns.iter().cloned().collect();
    let mut out = plan::build(review, &masked).refusals;
    out.extend(leaks::scan(
        review,
        &leaks::MaskedValues::new(masked_values),
    ));
    let t = Timeouts {
        statement: timeout,
        lock: timeout,
    };
    let deps = async {
        let side = Side::connect("scratch", scratch, t).await?;
        side.begin().await?;
        let d = safety::dependencies(&side, review).await;
        let _ = side.rollback().await;
        d
    }
    .await;
    match deps {
        Ok(d) => out.extend(safety::judge(&d)),
        Err(e) => out.push(format!(
            "the expressions of the change could not be checked in the scratch database: {e}"
        )),
    }
    out.extend(unmodelled(stored));
    out
}

/// What the review's patch check says about changes the review does not model. Fails
/// closed: a check not made (or a review stored without one) cannot rule them out.
fn unmodelled(stored: Option<&Review>) -> Option<String> {
    let unknown = "whether the scratch database holds changes the review does not model \
                   (row security, rules, storage options, replica identity, statistics, \
                   default privileges, …) is unknown; not promoted (review.verify_on_end \
                   checks it when a token ends)";
    match stored.map(|r| r.verification.as_ref()) {
        None => Some(format!("the token's review is not stored: {unknown}")),
        Some(None) => Some(format!("the review has no patch check: {unknown}")),
        Some(Some(v)) => match v.status {
            VerifyStatus::Exact => None,
            VerifyStatus::Differs => Some(format!(
                "{}: the scratch database holds changes the review does not model \
                 (e.g. row security, rules, storage options, replica identity, statistics, \
                 default privileges); apply them by hand",
                v.summary
            )),
            VerifyStatus::NotVerified => Some(format!("{}: {unknown}", v.summary)),
        },
    }
}
