#!/usr/bin/env bash
# Cold fork and warm pool first-query times: now a section of bench/run (printed, not asserted).
exec "$(dirname "$0")/run" --only warm,cold "$@"
