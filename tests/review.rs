//! What a person reads and promotes: the review diff end to end and by property, the review
//! pages in a real browser, end-of-token work that skips tables, decisions and promotion.

// Each suite uses only part of the shared helpers.
#[allow(dead_code)]
mod support;

/// One file per concern, in tests/review/.
mod review {
    mod catalog_changes;
    mod diffs;
    mod promote;
    mod review_page;
    mod review_property;
    mod review_skip;
}
