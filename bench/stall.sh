#!/usr/bin/env bash
# Another token's `select 1` (and login) latency while one token sends the worst message it
# can, as a ratio to the idle latency of the same run: the stall section of bench/run
# (printed, not asserted). `bench/stall.sh --quick` for 200 queries per figure.
exec "$(dirname "$0")/run" --only stall "$@"
