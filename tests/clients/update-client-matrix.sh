#!/usr/bin/env bash
# Copy the client matrix that `cargo test --test agent clients::` wrote (<target>/client-matrix.md)
# into docs/clients.md, between the client-matrix markers. Usage: update-client-matrix.sh [MATRIX.md]
set -euo pipefail
cd "$(dirname "$0")/../.."
matrix="${1:-${CARGO_TARGET_DIR:-target}/client-matrix.md}"
[ -s "$matrix" ] || { echo "no matrix at $matrix: run cargo test --test agent clients:: first" >&2; exit 1; }
python3 - "$matrix" docs/clients.md <<'PY'
import sys
matrix, readme = open(sys.argv[1]).read().strip(), sys.argv[2]
text = open(readme).read()
start, end = "<!-- client-matrix:start -->", "<!-- client-matrix:end -->"
if start not in text or end not in text:
    sys.exit("docs/clients.md has no client-matrix markers")
head, rest = text.split(start, 1)
_, tail = rest.split(end, 1)
open(readme, "w").write(f"{head}{start}\n{matrix}\n{end}{tail}")
PY
echo "docs/clients.md updated from $matrix"
