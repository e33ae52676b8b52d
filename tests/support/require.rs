//! One rule for tests that need something the machine may lack (root, network namespaces,
//! Chromium, fallocate, a container engine): under `CI=true` a missing capability fails the
//! test, so CI cannot go green by checking nothing; elsewhere the test is skipped and says why.

/// True when this run is CI (`CI=true` or `CI=1`, as most CI systems set it).
pub fn in_ci() -> bool {
    matches!(
        std::env::var("CI")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Ok("true") | Ok("1")
    )
}

/// `available`: the capability probe's result. Returns true when the test may go on. When it
/// is missing: panics under CI, otherwise prints `skipped: <what> (<why>)` and returns false,
/// and the caller returns early.
#[must_use]
pub fn require(available: bool, what: &str, why: &str) -> bool {
    if available {
        return true;
    }
    if in_ci() {
        panic!("CI=true and {what} is missing ({why}): scripts/setup-dev.sh provides it");
    }
    eprintln!("skipped: {what} is missing ({why})");
    false
}

/// Like `require`, for a capability CI does not promise (it may exist on a developer's
/// machine, never on the CI runner): skipped with a printed reason everywhere.
#[must_use]
pub fn optional(available: bool, what: &str, why: &str) -> bool {
    if !available {
        eprintln!("skipped: {what} is missing ({why}); optional, CI does not provide it");
    }
    available
}
