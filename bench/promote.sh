#!/usr/bin/env bash
# Promotion time of a large update: a task updates ROWS rows of a 2*ROWS-row table; the
# change is approved and promoted onto a second token's fresh fork of the same golden (a
# real database reached through the gateway, identical to the golden). The baseline, in the
# same run, is the same UPDATE run directly on a third fresh fork. Printed, not asserted.
#   ROWS=50000   rows updated
#   RUNS=3       promotions (dry runs: each applies everything and rolls back) per figure
#   BIN=path     a sandpit binary to use instead of building the release one
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${ROWS:-50000}
RUNS=${RUNS:-3}
if [ -z "${BIN:-}" ]; then
  cargo build --release -q
  BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/sandpit
fi
ROOT=$(mktemp -d /tmp/sandpit-bench-promote-XXXXXX)
chmod 755 "$ROOT"
GW=
cleanup() {
  if [ -n "$GW" ]; then kill "$GW" 2>/dev/null || true; wait "$GW" 2>/dev/null || true; fi
  rm -rf "$ROOT"
}
trap cleanup EXIT
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

cat >"$ROOT/golden.sql" <<SQL
create table t (id int primary key, label text not null, amount numeric(12,2) not null);
insert into t select g, 'row ' || g, g * 0.37 from generate_series(1, $((ROWS * 2))) g;
SQL
printf '[pool]\nsize = 0\n[promote]\nmax_rows = %s\n' "$((ROWS + 10))" >"$ROOT/sandpit.toml"
env -u SANDPIT_ADMIN_KEY "$BIN" serve --config "$ROOT/sandpit.toml" --data-dir "$ROOT/gw" \
  --listen 127.0.0.1:0 --api-listen 127.0.0.1:0 --golden-sql "$ROOT/golden.sql" >"$ROOT/out" 2>"$ROOT/gateway.log" &
GW=$!
for _ in $(seq 1 3000); do
  grep -q "sandpit ready" "$ROOT/out" 2>/dev/null && break
  kill -0 "$GW" 2>/dev/null || { tail -5 "$ROOT/gateway.log" >&2; exit 1; }
  sleep 0.1
done
API=$(sed -n 's/.*api=\([^ ]*\).*/\1/p' "$ROOT/out")
export SANDPIT_ADMIN_KEY=$(cat "$ROOT/gw/admin.key")
issue() { "$BIN" token issue --task "$1" --ttl 30m --api "$API"; }
id_of() { echo "$1" | sed 's|postgresql://\([^:]*\):.*|\1|'; }
UPDATE="update t set label = label || ' (edited)', amount = amount + 1 where id <= $ROWS"

task=$(issue bench-promote-task)
psql "$task" -XAtq -v ON_ERROR_STOP=1 -c "$UPDATE" >/dev/null
tid=$(id_of "$task")
t0=$(date +%s%N)
"$BIN" token revoke "$tid" --api "$API" >/dev/null
end_ms=$(ms "$t0")
"$BIN" review approve "$tid" --comment bench --api "$API" >/dev/null

target=$(issue bench-promote-target)
dry=()
for _ in $(seq 1 "$RUNS"); do
  t0=$(date +%s%N)
  out=$(SANDPIT_PROMOTE_TARGET="$target" "$BIN" promote "$tid" --dry-run --json --api "$API" || true)
  dry+=("$(ms "$t0")")
  echo "$out" | grep -q '"outcome": *"dry_run"' || { echo "dry run did not apply: $out" >&2; exit 1; }
done
t0=$(date +%s%N)
out=$(SANDPIT_PROMOTE_TARGET="$target" "$BIN" promote "$tid" --json --api "$API" || true)
real_ms=$(ms "$t0")
echo "$out" | grep -q '"outcome": *"applied"' || { echo "promotion did not apply: $out" >&2; exit 1; }
edited=$(psql "$target" -XAtq -c "select count(*) from t where label like '% (edited)'")

direct=$(issue bench-promote-direct)
base=()
for _ in $(seq 1 "$RUNS"); do
  t0=$(date +%s%N)
  psql "$direct" -XAtq -v ON_ERROR_STOP=1 -c "begin; $UPDATE; rollback" >/dev/null
  base+=("$(ms "$t0")")
done
d=$(median "${dry[@]}"); b=$(median "${base[@]}")
echo "| rows updated | token end (review + capture) ms | promote, dry run ms (median of $RUNS) | promote, applied ms | rows edited in the target | same UPDATE run directly ms (median of $RUNS) | promote / direct |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
printf '| %s | %s | %s | %s | %s | %s | %.1fx |\n' "$ROWS" "$end_ms" "$d" "$real_ms" "$edited" "$b" \
  "$(awk -v a="$d" -v b="$b" 'BEGIN { print (b > 0 ? a / b : 0) }')"
