#!/usr/bin/env bash
# pgbench through the gateway: `pgbench -i -s 5`, then `-c 8 -T $PGBENCH_SECONDS` (default 10)
# in each of -M simple, extended, prepared; every run must finish with zero failed
# transactions. In: SANDPIT_DSN (a token whose max_connections allows 8+ sessions).
# Out: `STEP <name> ok|fail <detail>` lines, and the last pgbench output on failure.
set -u
DSN="$SANDPIT_DSN"
SECS="${PGBENCH_SECONDS:-10}"
CLIENTS="${PGBENCH_CLIENTS:-8}"
failed=0

# pgbench ships with the server packages; find it the way the provider finds binaries.
find_pgbench() {
  if command -v pgbench >/dev/null 2>&1; then command -v pgbench; return; fi
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/pgbench" ]; then
    echo "$(pg_config --bindir)/pgbench"; return
  fi
  ls -d /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | sort -V | tail -1
}
PGBENCH=$(find_pgbench)
if [ -z "$PGBENCH" ]; then
  echo "STEP pgbench_init fail pgbench not found"
  exit 1
fi
echo "VERSION $("$PGBENCH" --version | awk '{print $3}')"

out=$("$PGBENCH" -i -s 5 -q "$DSN" 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q "done in"; then
  echo "STEP pgbench_init ok $(echo "$out" | grep -o 'done in [0-9.]* s' | head -1)"
else
  echo "STEP pgbench_init fail $(echo "$out" | tail -3 | tr '\n' ' ')"
  exit 1
fi

for mode in simple extended prepared; do
  out=$("$PGBENCH" -c "$CLIENTS" -j 2 -T "$SECS" -M "$mode" -n "$DSN" 2>&1)
  rc=$?
  processed=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
  failed_tx=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
  tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
  # pgbench before 15 has no failure line; it then exits non-zero on any error.
  if [ $rc -eq 0 ] && [ "${processed:-0}" -gt 0 ] && [ "${failed_tx:-0}" = 0 ] && ! echo "$out" | grep -qi 'error'; then
    echo "STEP pgbench_$mode ok $processed tx, 0 failed, ${tps%.*} tps (-c $CLIENTS -T $SECS)"
  else
    echo "STEP pgbench_$mode fail rc=$rc processed=${processed:-?} failed=${failed_tx:-?}"
    echo "$out" | tail -20
    failed=1
  fi
done
exit $failed
