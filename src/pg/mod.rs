//! Local PostgreSQL server binaries, the unprivileged OS user servers run as, and process control.
