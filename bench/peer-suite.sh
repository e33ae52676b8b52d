#!/usr/bin/env bash
# A peer's own test suite (psycopg2's, from its PyPI sdist) run through a sandpit token and
# directly against a stock PostgreSQL in the same run; prints the tests that pass directly but
# fail through sandpit and writes them to target/peer-suite.md. See docs/peer-suite.md.
# Usage: bench/peer-suite.sh [--only test_connection,test_cursor] [--cap SECS] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--no-build" ]; then
  shift
else
  CARGO_INCREMENTAL=0 cargo build -q --locked --bin sandpit
fi
exec python3 bench/lib/peer_suite.py "$@"
