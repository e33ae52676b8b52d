#!/usr/bin/env bash
# The client scenario with psql (libpq), through the gateway.
# In: SANDPIT_DSN (from `token issue`), SANDPIT_DSN_CLEARTEXT (agent / <id>.<secret>,
# sslmode=require), SANDPIT_CAPS=1 to run the capped SELECT too.
# Out: one `STEP <name> ok|fail|skip <detail>` line per step; exit 1 if any failed.
set -u
DSN="$SANDPIT_DSN"
CLEAR="$SANDPIT_DSN_CLEARTEXT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"; jobs -p | xargs -r kill 2>/dev/null' EXIT
failed=0

echo "VERSION $(psql --version | awk '{print $3}') (libpq $(pg_config --version 2>/dev/null | awk '{print $2}'))"

# q DSN SQL...: run with psql, unaligned tuples only, stop on error; stdout only.
q() {
  local dsn="$1"
  shift
  local args=()
  for c in "$@"; do args+=(-c "$c"); done
  psql "$dsn" -X -q -At -v ON_ERROR_STOP=1 "${args[@]}"
}

# step NAME FUNCTION: FUNCTION prints a detail on success, or returns non-zero after
# printing why.
step() {
  local name="$1" fn="$2" out
  if out=$("$fn" 2>&1); then
    out="${out//$'\n'/ }"
    echo "STEP $name ok ${out:0:200}"
  else
    out="${out//$'\n'/ }"
    echo "STEP $name fail ${out:0:600}"
    failed=1
  fi
}

expect() { # expect WHAT GOT WANT
  if [ "$2" != "$3" ]; then
    echo "$1: got [$2], want [$3]"
    return 1
  fi
}

connect_scram() {
  local got
  got=$(q "$DSN" "select current_user") || return 1
  expect user "$got" agent
}

connect_tls_cleartext() {
  local got
  got=$(q "$CLEAR" "select 'in'") || return 1
  expect select "$got" in
}

channel_binding() {
  local got
  got=$(q "$DSN?sslmode=require&channel_binding=require" "select 'bound'") || return 1
  expect select "$got" bound && echo "channel_binding=require"
}

create_table() {
  q "$DSN" "create table scenario(id int primary key, name text not null)" || return 1
  q "$DSN" "select count(*) from scenario" >/dev/null
}

insert_params() {
  # psql 15 has no \bind: parameters go through a server-side prepared statement.
  local got
  got=$(q "$DSN" "prepare ins(int, text) as insert into scenario values (\$1, \$2)" \
    "execute ins(1, 'one')" "select name from scenario where id = 1") || return 1
  expect row "$got" one && echo "PREPARE/EXECUTE"
}

prepared_reuse() {
  local got
  got=$(q "$DSN" "prepare ins(int, text) as insert into scenario values (\$1, \$2)" \
    "execute ins(2, 'two')" "execute ins(3, 'three')" "execute ins(4, 'four')" \
    "select count(*) from scenario where id between 2 and 4") || return 1
  expect count "$got" 3
}

transaction_rollback() {
  local got
  got=$(q "$DSN" "begin" "insert into scenario values (100, 'gone')" "rollback" \
    "select count(*) from scenario where id = 100") || return 1
  expect count "$got" 0
}

savepoint() {
  local got
  got=$(q "$DSN" "begin" "insert into scenario values (200, 'kept')" "savepoint s" \
    "insert into scenario values (201, 'undone')" "rollback to savepoint s" "commit" \
    "select string_agg(id::text, ',' order by id) from scenario where id >= 200") || return 1
  expect ids "$got" 200
}

copy_in() {
  seq 1000 1999 | awk '{print $1 "\tcopied " $1}' > "$WORK/in.tsv"
  psql "$DSN" -X -q -v ON_ERROR_STOP=1 -c "copy scenario from stdin" < "$WORK/in.tsv" || return 1
  local got
  got=$(q "$DSN" "select count(*) from scenario where name like 'copied %'") || return 1
  expect count "$got" 1000
}

copy_out() {
  local got
  got=$(q "$DSN" "copy (select id, name from scenario where id between 1000 and 1999 order by id) to stdout" | sha256sum)
  expect sha256 "$got" "$(sha256sum < "$WORK/in.tsv")"
}

# Wait until a statement matching $2 is running in another session.
wait_active() {
  local i
  for i in $(seq 1 200); do
    [ "$(q "$1" "select count(*) from pg_stat_activity where state = 'active' and query like '$2' and pid <> pg_backend_pid()" 2>/dev/null)" -ge 1 ] 2>/dev/null && return 0
    sleep 0.1
  done
  echo "statement '$2' never became active"
  return 1
}

listen_notify() {
  # Session A listens, then sleeps so that the notification arrives while it is connected;
  # psql prints notifications after each command.
  psql "$DSN" -X -v ON_ERROR_STOP=1 -c "listen scenario_ch" -c "select pg_sleep(3) /* listener */" \
    -c "select 1" > "$WORK/listen.out" 2>&1 &
  local a=$!
  wait_active "$DSN" '%listener%' || return 1
  q "$DSN" "notify scenario_ch, 'hello from B'" || return 1
  wait $a || { cat "$WORK/listen.out"; return 1; }
  grep -q 'Asynchronous notification "scenario_ch" with payload "hello from B"' "$WORK/listen.out" || {
    cat "$WORK/listen.out"
    return 1
  }
}

cancel() {
  # psql's own cancel path: SIGINT makes it send a CancelRequest with the key it got.
  local start=$SECONDS
  psql "$DSN" -X -v VERBOSITY=verbose -c "select pg_sleep(30) /* to cancel */" > "$WORK/cancel.out" 2>&1 &
  local p=$!
  wait_active "$DSN" '%to cancel%' || return 1
  kill -INT $p
  wait $p
  local rc=$?
  grep -q '57014' "$WORK/cancel.out" || { echo "rc=$rc"; cat "$WORK/cancel.out"; return 1; }
  [ $((SECONDS - start)) -lt 25 ] || { echo "took $((SECONDS - start)) s"; return 1; }
  echo "SQLSTATE 57014"
}

unique_violation() {
  local out
  out=$(psql "$DSN" -X -v VERBOSITY=verbose -c "insert into scenario values (1, 'dup')" 2>&1)
  echo "$out" | grep -q 'ERROR:  23505: duplicate key value violates unique constraint "scenario_pkey"' || {
    echo "$out"
    return 1
  }
  echo "SQLSTATE 23505"
}

types_roundtrip() {
  local want got
  q "$DSN" "create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])" || return 1
  q "$DSN" "insert into types values (12345678901234567890.000000012345, '{\"k\": [1, 2.5, \"x\"], \"n\": null}', '2024-02-29 23:59:59.123456+00', '\\xdeadbeef00ff', '{1,2,NULL,4}', '{\"a b\",\"c,d\",\"\"}')" || return 1
  want='12345678901234567890.000000012345|{"k": [1, 2.5, "x"], "n": null}|2024-02-29 23:59:59.123456+00|\xdeadbeef00ff|{1,2,NULL,4}|{"a b","c,d",""}'
  got=$(PGTZ=UTC q "$DSN" "select n, j, ts, b, a, t from types") || return 1
  expect types "$got" "$want"
}

cursor() {
  local got
  got=$(q "$DSN" "begin" "declare c cursor for select g from generate_series(1, 1000) g" \
    "fetch 150 from c" "fetch 150 from c" "fetch 150 from c" "fetch 150 from c" "fetch 150 from c" "fetch 150 from c" "fetch 150 from c" "close c" "commit" | wc -l) || return 1
  expect rows "$got" 1000 && echo "7 fetches"
}

capped_select() {
  local rows
  rows=$(psql "$DSN" -X -At -c "select * from generate_series(1, 100000)" 2> "$WORK/cap.err" | wc -l)
  expect rows "$rows" 200 || return 1
  grep -q NOTICE "$WORK/cap.err" || { echo "no NOTICE: $(cat "$WORK/cap.err")"; return 1; }
}

describe() {
  local out
  out=$(psql "$DSN" -X -c '\d scenario' 2>&1) || { echo "$out"; return 1; }
  echo "$out" | grep -q '"scenario_pkey" PRIMARY KEY, btree (id)' || { echo "$out"; return 1; }
  out=$(psql "$DSN" -X -c '\dt' 2>&1) || { echo "$out"; return 1; }
  echo "$out" | grep -q 'items' || { echo "$out"; return 1; }
  echo '\d, \dt'
}

meta_copy() {
  local got
  psql "$DSN" -X -q -v ON_ERROR_STOP=1 -c "\\copy (select * from scenario where id < 1000 order by id) to '$WORK/meta.csv' csv" || return 1
  q "$DSN" "create table scenario_copy (like scenario)" || return 1
  psql "$DSN" -X -q -v ON_ERROR_STOP=1 -c "\\copy scenario_copy from '$WORK/meta.csv' csv" || return 1
  got=$(q "$DSN" "select count(*) from (select * from scenario where id < 1000 except select * from scenario_copy) d") || return 1
  expect difference "$got" 0 || return 1
  got=$(wc -l < "$WORK/meta.csv")
  [ "$got" -ge 4 ] || { echo "only $got rows"; return 1; }
}

large_object() {
  # \lo_import / \lo_export use libpq's large-object calls: FunctionCall ('F') messages.
  head -c 300000 /dev/urandom > "$WORK/blob.in"
  cat > "$WORK/lo.sql" <<EOF
\\lo_import '$WORK/blob.in'
\\set o :LASTOID
\\lo_export :o '$WORK/blob.out'
select count(*) from pg_largeobject_metadata where oid = :o;
\\lo_unlink :o
EOF
  local out
  out=$(psql "$DSN" -X -At -v ON_ERROR_STOP=1 -f "$WORK/lo.sql" 2>&1) || { echo "$out"; return 1; }
  cmp -s "$WORK/blob.in" "$WORK/blob.out" || { echo "exported bytes differ: $out"; return 1; }
  echo "300000 bytes"
}

terminate_self() {
  # psql has no driver-level error classes: the server's FATAL, with its SQLSTATE, and
  # nothing after it from the gateway.
  local out rc
  out=$(psql "$DSN" -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose \
    -c "select pg_terminate_backend(pg_backend_pid())" 2>&1)
  rc=$?
  [ "$rc" -ne 0 ] || { echo "psql exited 0: $out"; return 1; }
  case "$out" in
  *"FATAL:  57P01: terminating connection due to administrator command"*) ;;
  *) echo "no FATAL 57P01: $out"; return 1 ;;
  esac
  case "$out" in
  *08006* | *"scratch database"*) echo "more than the server's FATAL: $out"; return 1 ;;
  esac
  echo "FATAL 57P01 and nothing else"
}

two_phase() {
  local mpt got
  mpt=$(q "$DSN" "show max_prepared_transactions") || return 1
  if [ "$mpt" = 0 ]; then
    echo "SKIP max_prepared_transactions is 0 on this server"
    return 0
  fi
  got=$(q "$DSN" "create table tpc_psql(id int)" "begin" "insert into tpc_psql values (1)" \
    "prepare transaction 'sandpit-psql'" "commit prepared 'sandpit-psql'" \
    "select count(*) from tpc_psql" "select count(*) from pg_prepared_xacts") || return 1
  expect "rows, prepared left" "$(echo $got)" "1 0" &&
    echo "PREPARE TRANSACTION / COMMIT PREPARED (max_prepared_transactions = $mpt)"
}

write_returning_uncapped() {
  local got
  got=$(q "$DSN" "create table returning_psql(id serial primary key, g int)" \
    "insert into returning_psql(g) select generate_series(1, 500) returning id" | wc -l) || return 1
  expect "rows returned" "$got" 500 && echo "INSERT … RETURNING of 500 rows"
}

step connect_scram connect_scram
step connect_tls_cleartext connect_tls_cleartext
step channel_binding channel_binding
step create_table create_table
step insert_params insert_params
step prepared_reuse prepared_reuse
step transaction_rollback transaction_rollback
step savepoint savepoint
step copy_in copy_in
step copy_out copy_out
step listen_notify listen_notify
step cancel cancel
step unique_violation unique_violation
step types_roundtrip types_roundtrip
step cursor cursor
step describe describe
step meta_copy meta_copy
step large_object large_object
step terminate_self terminate_self
step write_returning_uncapped write_returning_uncapped
# two_phase prints "SKIP why" when the server has no prepared transactions.
rc=0
out=$(two_phase 2>&1) || rc=$?
out="${out//$'\n'/ }"
if [ "$rc" -ne 0 ]; then
  echo "STEP two_phase fail ${out:0:600}"
  failed=1
elif [ "${out#SKIP }" != "$out" ]; then
  echo "STEP two_phase skip ${out#SKIP }"
else
  echo "STEP two_phase ok ${out:0:200}"
fi
if [ "${SANDPIT_CAPS:-0}" = 1 ]; then
  step capped_select capped_select
else
  echo "STEP capped_select skip SANDPIT_CAPS is not 1"
fi
exit $failed
