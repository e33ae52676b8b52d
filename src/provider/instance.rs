//! The `instance` provider: one Postgres process per fork, on a copy of the golden data dir.
