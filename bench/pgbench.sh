#!/usr/bin/env bash
# pgbench through the gateway vs straight to a Postgres server, measured in the same run:
# `pgbench -i -s 5`, then `-c 8 -T $SECS` (default 30) in each of -M simple, extended,
# prepared. The baseline is a Postgres server of the same binaries with the scratch
# instance's settings, reached over TCP loopback; the gateway is reached over TCP loopback
# without TLS (sslmode=disable) and with it (sslmode=require). Prints tps and the ratio to
# the baseline; asserts nothing but zero failed transactions.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-30}
CLIENTS=${CLIENTS:-8}
cargo build --release -q
BIN="${CARGO_TARGET_DIR:-target}/release/sandpit"
DIR=$(mktemp -d /tmp/sandpit-pgbench-XXXXXX)
chmod 755 "$DIR"
BINDIR=$(pg_config --bindir 2>/dev/null || ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGBENCH="$BINDIR/pgbench"
[ -x "$PGBENCH" ] || PGBENCH=$(command -v pgbench)

printf 'create table items(id int primary key, name text not null);\n' > "$DIR/golden.sql"
"$BIN" serve --data-dir "$DIR/gw" --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 \
  --golden-sql "$DIR/golden.sql" >"$DIR/out" 2>"$DIR/gateway.log" &
GW=$!
BASE_PID=""
cleanup() {
  kill $GW 2>/dev/null || true
  wait $GW 2>/dev/null || true
  if [ -n "$BASE_PID" ]; then as_pg "$BINDIR/pg_ctl" -D "$DIR/base" -m immediate stop >/dev/null 2>&1 || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT

# Postgres refuses to run as root: the baseline runs as the gateway's unprivileged user.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u sandpit -- "$@"; else "$@"; fi
}

for _ in $(seq 1 1200); do grep -q "sandpit ready" "$DIR/out" 2>/dev/null && break; sleep 0.1; done
API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$DIR/out")
export SANDPIT_ADMIN_KEY=$(cat "$DIR/gw/admin.key")
TOKEN=$(curl -fsS -H "Authorization: Bearer $SANDPIT_ADMIN_KEY" -H 'content-type: application/json' \
  -d "{\"task\":\"pgbench\",\"ttl_seconds\":3600,\"max_connections\":$((CLIENTS + 4))}" "$API/v1/tokens")
GW_DSN=$(echo "$TOKEN" | sed -n 's/.*"dsn":"\([^"]*\)".*/\1/p')

# Baseline server: same binaries, the scratch instance's settings, TCP on a free port.
mkdir -p "$DIR/base" && chmod 700 "$DIR/base"
[ "$(id -u)" = 0 ] && chown sandpit "$DIR/base"
as_pg "$BINDIR/initdb" -D "$DIR/base" -U bench --auth=trust -E UTF8 >/dev/null
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg "$BINDIR/pg_ctl" -D "$DIR/base" -w -l "$DIR/base/server.log" -o \
  "-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$DIR/base -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c autovacuum=off -c max_connections=30" \
  start >/dev/null
BASE_PID=started
BASE_DSN="postgresql://bench@127.0.0.1:$PORT/postgres?sslmode=disable"

run() { # run DSN MODE -> tps
  local out
  out=$("$PGBENCH" -c "$CLIENTS" -j 2 -T "$SECS" -M "$2" -n "$1" 2>&1)
  local failed
  failed=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
  if [ "${failed:-0}" != 0 ]; then echo "failed transactions: $failed" >&2; echo "$out" >&2; exit 1; fi
  echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1
}

"$PGBENCH" -i -s 5 -q "$BASE_DSN" >/dev/null 2>&1
"$PGBENCH" -i -s 5 -q "$GW_DSN?sslmode=disable" >/dev/null 2>&1
echo "pgbench -c $CLIENTS -j 2 -T $SECS, scale 5 ($("$PGBENCH" --version | awk '{print $3}')); tps, ratio to direct"
echo
echo "| mode | direct (TCP) | sandpit (TCP) | ratio | sandpit (TLS) | ratio |"
echo "| --- | --- | --- | --- | --- | --- |"
for mode in simple extended prepared; do
  b=$(run "$BASE_DSN" "$mode")
  g=$(run "$GW_DSN?sslmode=disable" "$mode")
  t=$(run "$GW_DSN?sslmode=require" "$mode")
  echo "| $mode | $b | $g | $(python3 -c "print(f'{$g/$b:.2f}')") | $t | $(python3 -c "print(f'{$t/$b:.2f}')") |"
done
