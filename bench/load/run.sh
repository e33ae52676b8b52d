#!/usr/bin/env bash
# 200 concurrent tokens (TOKENS), each its own task with its own scratch Postgres, doing a
# mixed read/write workload through one gateway for DURATION seconds (QUICK=1: 15 s).
# Checks zero cross-task reads, zero failed statements, and no ERROR line in the gateway's
# log; prints the figures. Needs python3 with psycopg 3 (bash .ci/run installs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
TOKENS=${TOKENS:-200}
DURATION=${DURATION:-60}
[ "${QUICK:-0}" = 1 ] && DURATION=15
cargo build --release -q
BIN=${CARGO_TARGET_DIR:-target}/release/sandpit
DIR=$(mktemp -d /tmp/sandpit-load-XXXXXX)
chmod 755 "$DIR"
cat >"$DIR/golden.sql" <<'SQL'
create table items(id int primary key, name text not null);
insert into items select g, 'item ' || g from generate_series(1, 1000) g;
SQL
# Small scratch servers: a few connections each (shared memory scales with it).
cat >"$DIR/sandpit.toml" <<TOML
[postgres]
max_connections = 5
[tokens]
max_connections = 2
TOML
# 200 clients, 200 backend sockets and 200 statement logs: more than the usual 1024 fds.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
SANDPIT_LOG=info "$BIN" serve --log-format json --config "$DIR/sandpit.toml" --data-dir "$DIR" \
  --golden-sql "$DIR/golden.sql" --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 \
  >"$DIR/out" 2>"$DIR/gateway.log" &
GW=$!
trap 'kill $GW 2>/dev/null; wait $GW 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 1200); do grep -q "sandpit ready" "$DIR/out" 2>/dev/null && break; sleep 0.1; done
API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$DIR/out")
KEY=$(cat "$DIR/admin.key")
status=0
python3 bench/load/load.py --api "$API" --admin-key "$KEY" --tokens "$TOKENS" \
  --duration "$DURATION" >"$DIR/result.json" || status=$?
# Proportional set size of this run's scratch Postgres processes (shared memory counted once).
pg_pss=0
pg_procs=0
for pm in $(head -qn1 "$DIR"/pg/instances/*/data/postmaster.pid 2>/dev/null); do
  for p in "$pm" $(pgrep -P "$pm" || true); do
    v=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)
    pg_pss=$((pg_pss + ${v:-0}))
    pg_procs=$((pg_procs + 1))
  done
done
cat "$DIR/result.json"
errors=$(grep -c '"level":"ERROR"' "$DIR/gateway.log" || true)
backends=$(ls "$DIR/pg/instances" | wc -l)
rss=$(awk '/VmRSS/ {print $2}' /proc/$GW/status)
internal=$(curl -s -H "Authorization: Bearer $KEY" "$API/metrics" \
  | grep -E '^sandpit_(log_errors_total|protocol_violations_total)' || true)
echo "gateway ERROR lines: $errors"
echo "scratch servers: $backends ($pg_procs postgres processes, PSS $((pg_pss / 1024)) MiB); gateway RSS: $((rss / 1024)) MiB"
echo "internal-error metrics: ${internal:-none}"
if [ "$errors" -gt 0 ]; then
  grep '"level":"ERROR"' "$DIR/gateway.log" | head -5
  status=1
fi
[ -z "$internal" ] || status=1
exit $status
