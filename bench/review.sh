#!/usr/bin/env bash
# Review time vs golden size, after a change to one table: the default review (only tables
# whose Postgres counters moved are read) against a full scan of every table (the baseline),
# measured in the same run on the same fork. Printed, not asserted.
#   SIZES="10000 100000 1000000"  rows per table of the generated goldens (4 tables each)
#   RUNS=5                         reviews per figure (median)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"10000 100000 1000000"}
RUNS=${RUNS:-5}
cargo build --release -q
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/sandpit
ROOT=$(mktemp -d /tmp/sandpit-bench-review-XXXXXX)
chmod 755 "$ROOT"
GW=
cleanup() {
  if [ -n "$GW" ]; then kill "$GW" 2>/dev/null || true; wait "$GW" 2>/dev/null || true; fi
  rm -rf "$ROOT"
}
trap cleanup EXIT

# golden_sql ROWS: four keyed tables of ROWS rows each.
golden_sql() {
  local n=$1
  for t in a b c d; do
    cat <<SQL
create table t_$t (id int primary key, grp int not null, label text not null, amount numeric(12,2), at timestamptz);
insert into t_$t select g, g % 100, 'row ' || g, g * 0.37, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute'
  from generate_series(1, $n) g;
SQL
  done
}

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# review_ms ID [--full-scan]: server-side duration of one review, in ms.
review_ms() {
  "$BIN" review "$@" --format json --api "$API" | sed -n 's/^ *"duration_ms": \([0-9.]*\).*/\1/p' | head -1
}

# bench NAME GOLDEN_SQL_FILE_OR_EMPTY TABLE TEXT_COLUMN
bench() {
  local name=$1 sql=$2 table=$3 col=$4 dir="$ROOT/$1"
  mkdir -p "$dir"; chmod 755 "$dir"
  local args=(serve --data-dir "$dir" --listen 127.0.0.1:0 --api-listen 127.0.0.1:0)
  [ -n "$sql" ] && args+=(--golden-sql "$sql")
  # The gateway must write its own admin.key (a key in the environment would be used instead).
  env -u SANDPIT_ADMIN_KEY "$BIN" "${args[@]}" >"$dir/out" 2>"$dir/gateway.log" &
  GW=$!
  for _ in $(seq 1 3000); do
    grep -q "sandpit ready" "$dir/out" 2>/dev/null && break
    kill -0 "$GW" 2>/dev/null || { echo "gateway for $name exited:" >&2; tail -5 "$dir/gateway.log" >&2; exit 1; }
    sleep 0.1
  done
  API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$dir/out")
  export SANDPIT_ADMIN_KEY=$(cat "$dir/admin.key")
  local dsn id
  dsn=$("$BIN" token issue --task bench --ttl 30m --api "$API")
  id=$(echo "$dsn" | sed 's|postgresql://\([^:]*\):.*|\1|')
  psql "$dsn" -XAtq -v ON_ERROR_STOP=1 -c "update $table set $col = $col || ' (edited)' where id <= 10" >/dev/null
  local first touched=() full=()
  local t0 t1
  t0=$(date +%s%N)
  review_ms "$id" >/dev/null   # also starts the reference fork
  t1=$(date +%s%N)
  first=$(( (t1 - t0) / 1000000 ))
  for _ in $(seq 1 "$RUNS"); do touched+=("$(review_ms "$id")"); done
  for _ in $(seq 1 "$RUNS"); do full+=("$(review_ms "$id" --full-scan)"); done
  local t f size rows
  t=$(median "${touched[@]}"); f=$(median "${full[@]}")
  size=$(du -sh "$dir"/pg/golden-* 2>/dev/null | awk '{print $1}' | head -1)
  rows=$(psql "$dsn" -XAtq -c "select sum(n_live_tup)::bigint from pg_stat_user_tables")
  printf '| %s | %s | %s | %s | %.0f | %.0f | %.1fx |\n' "$name" "${size:-?}" "$rows" "$first" "$t" "$f" \
    "$(awk -v a="$f" -v b="$t" 'BEGIN { print (b > 0 ? a / b : 0) }')"
  "$BIN" token revoke "$id" --api "$API" >/dev/null
  kill "$GW"; wait "$GW" 2>/dev/null || true; GW=
}

echo "| golden | data dir | rows | first review, wall ms (CLI + API; reference started in the background at the first fork) | review ms, touched tables only (server, median of $RUNS) | full scan ms (server, median of $RUNS) | full scan / touched |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
[ -n "${SKIP_DEMO:-}" ] || bench demo "" customers name
for n in $SIZES; do
  golden_sql "$n" >"$ROOT/golden-$n.sql"
  bench "gen-4x$n" "$ROOT/golden-$n.sql" t_a label
done
