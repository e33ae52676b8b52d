#!/usr/bin/env bash
# Time from `token issue` to the first row of `select 1` (a cold fork of the demo golden),
# median of N runs, with the copy method used. Printed, not asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
cargo build --release -q
BIN=target/release/sandpit
DIR=$(mktemp -d /tmp/sandpit-bench-XXXXXX)
chmod 755 "$DIR"
LOG="$DIR/gateway.log"
"$BIN" serve --data-dir "$DIR" --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 >"$DIR/out" 2>"$LOG" &
GW=$!
trap 'kill $GW 2>/dev/null; wait $GW 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 600); do grep -q "sandpit ready" "$DIR/out" 2>/dev/null && break; sleep 0.1; done
API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$DIR/out")
export SANDPIT_ADMIN_KEY=$(cat "$DIR/admin.key")
times=()
for i in $(seq 1 "$RUNS"); do
  t0=$(date +%s%N)
  DSN=$("$BIN" token issue --task "bench-$i" --ttl 5m --api "$API")
  psql "$DSN" -XAtc 'select 1' >/dev/null
  t1=$(date +%s%N)
  times+=($(( (t1 - t0) / 1000000 )))
  "$BIN" token revoke "$(echo "$DSN" | sed 's|postgresql://\([^:]*\):.*|\1|')" --api "$API" >/dev/null
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
median=${sorted[$(( RUNS / 2 ))]}
method=$(grep -o 'copy_method=[^ ]*' "$LOG" | head -1 | cut -d= -f2 | tr -d '"')
golden=$(du -sh "$DIR"/pg/golden-* 2>/dev/null | awk '{print $1}' | head -1)
echo "| figure | value |"
echo "| --- | --- |"
echo "| cold fork, token issue -> first row of select 1, median of $RUNS | ${median} ms |"
echo "| all runs (ms) | ${times[*]} |"
echo "| copy method | ${method:-unknown} |"
echo "| golden data dir size | ${golden:-?} |"
