#!/usr/bin/env bash
# pgbench -S in -M simple/extended/prepared through sandpit (plain and TLS) vs PgBouncer vs
# direct, on one scratch server: now the pgbench section of bench/run.
exec "$(dirname "$0")/run" --only pgbench "$@"
