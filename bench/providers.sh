#!/usr/bin/env bash
# First query of a new token per provider (instance, template, remote) × golden size × copy
# method, cold fork vs warm pool of 2: the providers section of bench/run (printed, not
# asserted). `--quick`: the ~20 MB golden only, fewer runs.
exec "$(dirname "$0")/run" --only providers "$@"
