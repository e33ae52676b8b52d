#!/usr/bin/env bash
# Row caps and statement logging, measured side by side in one run (printed, not asserted):
#  1. a capped `SELECT *` over a 10M-row table through sandpit ÷ the same with LIMIT 200
#     straight against the scratch Postgres (median of $RUNS);
#  2. pgbench -S TPS through sandpit with the statement log on ÷ off ÷ direct.
# Needs root (to reach the scratch server's socket directly). ROWS / SECONDS / CLIENTS adjust it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
ROWS=${ROWS:-10000000}
SECONDS_PER_RUN=${SECONDS:-15}
CLIENTS=${CLIENTS:-8}
PGBIN=$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
cargo build --release -q
BIN=target/release/sandpit
DIR=$(mktemp -d /tmp/sandpit-bench-XXXXXX)
chmod 755 "$DIR"
GW=
start() { # $1 = extra config
  printf '%s\n' "$1" >"$DIR/sandpit.toml"
  "$BIN" serve --config "$DIR/sandpit.toml" --data-dir "$DIR" --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 >"$DIR/out" 2>>"$DIR/gateway.log" &
  GW=$!
  for _ in $(seq 1 900); do grep -q "sandpit ready" "$DIR/out" 2>/dev/null && break; sleep 0.1; done
  API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$DIR/out")
  export SANDPIT_ADMIN_KEY=$(cat "$DIR/admin.key")
}
stop() { kill "$GW" 2>/dev/null; wait "$GW" 2>/dev/null || true; rm -f "$DIR/out"; }
trap 'stop; rm -rf "$DIR"' EXIT
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000 )); }

start ""
DSN=$("$BIN" token issue --task bench-caps --ttl 2h --max-connections 32 --api "$API")
ID=$(echo "$DSN" | sed 's|postgresql://\([^:]*\):.*|\1|')
PORT=$(echo "$DSN" | sed 's|.*@[^:]*:\([0-9]*\)/.*|\1|')
psql "$DSN" -Xq -c "create table ten as select g as id, md5(g::text) as v from generate_series(1, $ROWS) g" -c "vacuum analyze ten"
SOCK=$(sed -n 5p "$DIR"/pg/instances/"$ID"/data/postmaster.pid)
DIRECT="host=$SOCK port=5432 user=agent dbname=sandpit"
via=(); direct=()
for _ in $(seq 1 "$RUNS"); do
  via+=("$(ms psql "$DSN" -XAtq -c 'select * from ten')")
  direct+=("$(ms psql "$DIRECT" -XAtq -c 'select * from ten limit 200')")
done
via_med=$(printf '%s\n' "${via[@]}" | median)
direct_med=$(printf '%s\n' "${direct[@]}" | median)

"$PGBIN/pgbench" -i -q -s 10 "$DSN" >/dev/null 2>&1
tps() { "$PGBIN/pgbench" -n -S -M "${MODE:-simple}" -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" "$1" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1; }
tps_log_on=$(tps "$DSN")
tps_direct=$(tps "$DIRECT")
stop
start "[log]
statements = false"
tps_log_off=$(tps "$(echo "$DSN" | sed "s|:$PORT/|:$(sed -n 's/.*postgres=[^:]*:\([0-9]*\).*/\1/p' "$DIR/out")/|")")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo "| figure | value |"
echo "| --- | --- |"
echo "| capped \`select * from ten\` ($ROWS rows) through sandpit, median of $RUNS (psql wall time) | $((via_med / 1000)) ms |"
echo "| \`select * from ten limit 200\` direct to the scratch Postgres, median of $RUNS | $((direct_med / 1000)) ms |"
echo "| ratio capped-through-sandpit ÷ LIMIT-direct | $(ratio "$via_med" "$direct_med") |"
echo "| pgbench -S -c $CLIENTS, ${SECONDS_PER_RUN}s: through sandpit, log on | $tps_log_on tps |"
echo "| same, log off | $tps_log_off tps |"
echo "| same, direct to the scratch Postgres (unix socket) | $tps_direct tps |"
echo "| log on ÷ log off | $(ratio "$tps_log_on" "$tps_log_off") |"
echo "| log on ÷ direct | $(ratio "$tps_log_on" "$tps_direct") |"
echo
echo "machine: $(nproc) cores; client, gateway and Postgres share them."
