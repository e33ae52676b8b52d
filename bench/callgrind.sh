#!/usr/bin/env bash
# Gateway instructions per pgbench transaction, under callgrind (repeatable, unlike wall
# clock on a shared machine). Collection is switched on only around the measured run, so
# startup and the golden build are not counted.
#   bench/callgrind.sh [MODE] [TRANSACTIONS]     MODE: simple (default), extended, prepared
# Prints Ir per transaction and the top functions (inclusive); keeps the callgrind file.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-simple}
TX=${2:-2000}
LOG_ON=${LOG_ON:-true}
RELAY_THREADS=${RELAY_THREADS:-0}  # the gateway's relay_threads (0: the main pool)
BIN="${CARGO_TARGET_DIR:-target}/release/sandpit"
[ -x "$BIN" ] || cargo build --release -q
DIR=$(mktemp -d /var/tmp/sandpit-callgrind-XXXXXX)
chmod 755 "$DIR"
printf 'create table t(a int);\n' >"$DIR/golden.sql"
printf 'relay_threads = %s\n[pool]\nsize = 0\n[review]\non_end = false\n[log]\nstatements = %s\n' \
  "$RELAY_THREADS" "$LOG_ON" >"$DIR/sandpit.toml"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$DIR/callgrind.out" \
  "$BIN" serve --config "$DIR/sandpit.toml" --data-dir "$DIR/gw" --listen 127.0.0.1:0 \
  --api-listen 127.0.0.1:0 --golden-sql "$DIR/golden.sql" >"$DIR/out" 2>"$DIR/gateway.log" &
VG=$!
trap 'kill $VG 2>/dev/null; wait $VG 2>/dev/null; rm -rf "$DIR/gw"' EXIT
for _ in $(seq 1 3000); do grep -q "sandpit ready" "$DIR/out" 2>/dev/null && break; sleep 0.1; done
API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$DIR/out")
KEY=$(cat "$DIR/gw/admin.key")
DSN=$(curl -fsS -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
  -d '{"task":"callgrind","ttl_seconds":3600}' "$API/v1/tokens" | sed -n 's/.*"dsn":"\([^"]*\)".*/\1/p')
DSN="$DSN?sslmode=disable"
PGBENCH=$(ls /usr/lib/postgresql/*/bin/pgbench | sort -V | tail -1)
"$PGBENCH" -i -q -s 1 "$DSN" >/dev/null 2>&1
# Warm-up (caches, classification cache), then count only the measured transactions.
"$PGBENCH" -n -S -M "$MODE" -c 1 -t 200 "$DSN" >/dev/null
callgrind_control -z "$VG" >/dev/null
callgrind_control -i on "$VG" >/dev/null
"$PGBENCH" -n -S -M "$MODE" -c 1 -t "$TX" "$DSN" >/dev/null
callgrind_control -i off "$VG" >/dev/null
callgrind_control -d "$VG" >/dev/null
sleep 1
OUT=$(ls -t "$DIR"/callgrind.out* | head -1)
TOTAL=$(callgrind_annotate "$OUT" 2>/dev/null | sed -n 's/^\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
echo "mode=$MODE log=$LOG_ON transactions=$TX gateway Ir=$TOTAL Ir/transaction=$((TOTAL / TX))"
callgrind_annotate --inclusive=yes "$OUT" 2>/dev/null | sed -n '/file:function/,$p' | head -${TOP:-40}
echo "callgrind file: $OUT"
