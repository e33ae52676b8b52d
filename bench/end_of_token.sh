#!/usr/bin/env bash
# End of a token vs golden size: revoke → stored, verified review (diff, patch check on a
# fresh fork, promote capture, destroy; `token revoke` returns when all are done) for the
# same one-row change on a small and a large golden, side by side, in one run. The change is
# in a 1 000-row table both goldens share; the rest of the golden is bulk no one touches.
# Printed, never asserted.
#   SMALL_ROWS=250000 BIG_ROWS=5000000  bulk rows per golden (4 tables; ~50 MB / ~1 GB)
#   RUNS=3                              revokes per figure (median)
#   BASELINE=/path/to/sandpit           also time another build on the same goldens (e.g.
#                                       one from before the change), same runs
#   NO_BUILD=1                          use target/release/sandpit as it is
#   XFS_GB=8                            run on a loop-mounted XFS with reflink (needs root),
#                                       as `bench/run` does: forks are then reflink copies
set -euo pipefail
cd "$(dirname "$0")/.."
SMALL_ROWS=${SMALL_ROWS:-250000}
BIG_ROWS=${BIG_ROWS:-5000000}
RUNS=${RUNS:-3}
[ -n "${NO_BUILD:-}" ] || cargo build --release -q
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/sandpit
TOP=$(mktemp -d /tmp/sandpit-bench-eot-XXXXXX)
chmod 755 "$TOP"
ROOT=$TOP
GW=
MNT=
cleanup() {
  if [ -n "$GW" ]; then kill "$GW" 2>/dev/null || true; wait "$GW" 2>/dev/null || true; fi
  if [ -n "$MNT" ]; then umount "$MNT" 2>/dev/null || true; fi
  rm -rf "$TOP"
}
trap cleanup EXIT
if [ -n "${XFS_GB:-}" ]; then
  truncate -s "${XFS_GB}G" "$TOP/xfs.img"
  mkfs.xfs -q -m reflink=1 "$TOP/xfs.img"
  mkdir "$TOP/xfs"
  mount -o loop "$TOP/xfs.img" "$TOP/xfs"
  MNT=$TOP/xfs
  ROOT=$MNT
  chmod 755 "$ROOT"
  echo "on a loop-mounted XFS with reflink ($XFS_GB GB)" >&2
fi

# golden_sql ROWS: a small table the agent changes, and ROWS bulk rows over four tables.
golden_sql() {
  local per=$(( $1 / 4 ))
  cat <<SQL
create table accounts (id int primary key, owner text not null, balance numeric(12,2) not null);
insert into accounts select g, 'owner ' || g, g * 1.25 from generate_series(1, 1000) g;
SQL
  for t in a b c d; do
    cat <<SQL
create table bulk_$t (id bigint primary key, grp int not null, label text not null, at timestamptz not null);
insert into bulk_$t select g, g % 100, repeat(md5(g::text), 4), timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second'
  from generate_series(1, $per) g;
SQL
  done
}

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# start BIN DIR SQL: a gateway on DIR (the golden is built on the first start, reused after).
start() {
  local bin=$1 dir=$2 sql=$3
  env -u SANDPIT_ADMIN_KEY "$bin" serve --data-dir "$dir" --listen 127.0.0.1:0 \
    --api-listen 127.0.0.1:0 --golden-sql "$sql" >"$dir/out" 2>>"$dir/gateway.log" &
  GW=$!
  for _ in $(seq 1 36000); do
    grep -q "sandpit ready" "$dir/out" 2>/dev/null && break
    kill -0 "$GW" 2>/dev/null || { echo "gateway exited:" >&2; tail -5 "$dir/gateway.log" >&2; exit 1; }
    sleep 0.1
  done
  API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$dir/out")
  export SANDPIT_ADMIN_KEY=$(cat "$dir/admin.key")
}

stop() { kill "$GW"; wait "$GW" 2>/dev/null || true; GW=; : >"$1/out"; }

# one BIN: issue, change one row, revoke (timed); prints "revoke_ms verify_ms status scanned unchanged".
one() {
  local bin=$1 dsn id t0 t1 json
  dsn=$("$bin" token issue --task bench --ttl 30m --api "$API")
  id=$(echo "$dsn" | sed 's|postgresql://\([^:]*\):.*|\1|')
  psql "$dsn" -XAtq -v ON_ERROR_STOP=1 -c "update accounts set balance = balance + 1 where id = 42" >/dev/null
  t0=$(now_ms)
  "$bin" token revoke "$id" --api "$API" >/dev/null
  t1=$(now_ms)
  json=$("$bin" review "$id" --format json --api "$API")
  python3 - "$((t1 - t0))" <<PY "$json"
import json, sys
r = json.loads(sys.argv[2])
v = r.get("verification") or {}
c = v.get("compared") or {}
print(sys.argv[1], round(v.get("duration_ms", 0)), v.get("status", "none"),
      r["scan"]["tables_scanned"], c.get("tables_unchanged", "-"))
PY
}

# measure NAME BIN DIR SQL
measure() {
  local name=$1 bin=$2 dir=$3 sql=$4 out revs=() vers=() last
  start "$bin" "$dir" "$sql"
  one "$bin" >/dev/null   # warm-up: the reference fork starts, caches fill
  for _ in $(seq 1 "$RUNS"); do
    out=$(one "$bin"); last=$out
    revs+=("$(echo "$out" | awk '{print $1}')"); vers+=("$(echo "$out" | awk '{print $2}')")
  done
  stop "$dir"
  local size
  size=$(du -sm "$dir"/pg/golden* 2>/dev/null | awk '{s += $1} END {print s}')
  printf '%s %s %s %s %s\n' "$(median "${revs[@]}")" "$(median "${vers[@]}")" "$last" "$size" "$name" >"$dir/result"
}

declare -A RES
for size in small big; do
  rows=$SMALL_ROWS; [ "$size" = big ] && rows=$BIG_ROWS
  dir="$ROOT/$size"; mkdir -p "$dir"; chmod 755 "$dir"
  golden_sql "$rows" >"$ROOT/golden-$size.sql"
  t0=$(now_ms)
  start "$BIN" "$dir" "$ROOT/golden-$size.sql"
  stop "$dir"
  echo "golden $size ($rows bulk rows) built in $(( ($(now_ms) - t0) / 1000 )) s" >&2
  measure "$size" "$BIN" "$dir" "$ROOT/golden-$size.sql"
  RES[$size]=$(cat "$dir/result")
  if [ -n "${BASELINE:-}" ]; then
    measure "$size" "$BASELINE" "$dir" "$ROOT/golden-$size.sql"
    RES[$size-base]=$(cat "$dir/result")
  fi
done

row() { # KEY LABEL
  read -r rev ver _ _ status scanned unchanged size _ <<<"${RES[$1]}"
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$2" "$size" "$rev" "$ver" "$status" "$scanned" "$unchanged"
}
echo "| build, golden | golden data dir MB | revoke → stored verified review, ms (median of $RUNS) | patch check ms | check | tables read by the review | tables the check proved unchanged |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
row small "this build, small"; row big "this build, large"
[ -z "${BASELINE:-}" ] || { row small-base "baseline, small"; row big-base "baseline, large"; }
s=$(echo "${RES[small]}" | awk '{print $1}'); b=$(echo "${RES[big]}" | awk '{print $1}')
echo "large / small (this build): $(awk -v a="$b" -v c="$s" 'BEGIN { printf "%.2f", a / c }')"
if [ -n "${BASELINE:-}" ]; then
  s=$(echo "${RES[small-base]}" | awk '{print $1}'); b=$(echo "${RES[big-base]}" | awk '{print $1}')
  echo "large / small (baseline): $(awk -v a="$b" -v c="$s" 'BEGIN { printf "%.2f", a / c }')"
fi
