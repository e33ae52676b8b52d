#!/usr/bin/env bash
# Capped SELECT vs LIMIT 200 direct, and pgbench through sandpit (log on) vs PgBouncer vs
# direct: now sections of bench/run (printed, not asserted).
exec "$(dirname "$0")/run" --only caps,pgbench "$@"
