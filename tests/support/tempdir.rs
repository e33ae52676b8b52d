//! Scratch directories the unprivileged Postgres user can reach, for the test harness and for
//! the shared servers in `tests/support/` (also built into `examples/bench_backends.rs`).

use std::os::unix::fs::PermissionsExt;

/// A fresh directory under `TMPDIR` (mode 0755), removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    let t = tempfile::Builder::new()
        .prefix("sandpit-test-")
        .tempdir()
        .expect("tempdir");
    // The unprivileged Postgres user must be able to reach below it.
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    t
}
