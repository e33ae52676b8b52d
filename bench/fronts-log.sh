#!/usr/bin/env bash
# Why one token's statement log across fronts is a file per front in a shared directory, not
# a registry row per statement: the cost of one write-ahead record each way, measured in the
# same run on this machine, as ratios against the file write (what each front does).
#
#   file          one O_APPEND write(2) of a 200-byte record (the front's log; SIGKILL-safe,
#                 fsynced once a second in the background, as today)
#   select 1      one round trip to a local Postgres over TCP (the floor of any registry call)
#   insert, sync  one INSERT of the record, committed with synchronous_commit = on: what a
#                 registry row must cost to be durable before the statement is forwarded
#   insert, async the same with synchronous_commit = off (not durable: shown for scale)
#
# Then the cost a session start and end pays for `max_connections` across fronts (one
# admission round trip, committed, and one removal), as a ratio against `select 1`.
#
# Printed, not asserted. Needs root (runs Postgres as the `sandpit` user) and PostgreSQL 15.
# Usage: nice -n 19 bash bench/fronts-log.sh [records]
set -euo pipefail
N=${1:-2000}
BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
DIR=$(mktemp -d /tmp/sandpit-fronts-log.XXXXXX)
PORT=$((20000 + RANDOM % 20000))
chown sandpit "$DIR"
cleanup() {
    runuser -u sandpit -- "$BIN/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT
runuser -u sandpit -- "$BIN/initdb" -D "$DIR/pg" -U postgres -A trust >/dev/null
runuser -u sandpit -- "$BIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w \
    -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1" start >/dev/null

python3 - "$N" "$PORT" "$DIR" <<'EOF'
import os, statistics, sys, time
import psycopg

n, port, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
record = (b'{"type":"statement","seq":1,"ts":"2026-12-05T11:00:00.000000000Z","token":"sp_x",'
          b'"task":"bench","session":1,"protocol":"simple","text":"select 1","kind":"read"}')
record = record.ljust(199, b" ") + b"\n"

def timed(f):
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        f()
        out.append(time.perf_counter_ns() - t)
    return statistics.median(out) / 1000.0

fd = os.open(os.path.join(d, "front.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
rows = {"file": timed(lambda: os.write(fd, record))}
c = psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True)
c.execute("create table log(token text, front text, seq bigint, line bytea)")
rows["select 1"] = timed(lambda: c.execute("select 1"))
for mode in ("on", "off"):
    c.execute(f"set synchronous_commit = {mode}")
    rows[f"insert, {'sync' if mode == 'on' else 'async'}"] = timed(
        lambda: c.execute("insert into log values ('sp_x', 'f1', 1, %s)", (record,)))
base = rows["file"]
print(f"{n} records each; median microseconds per record, ratio to the file write")
for k, v in rows.items():
    print(f"  {k:<14} {v:9.1f} us  {v / base:8.1f} x")

# A session's admission across fronts (src/registry/sessions.rs: the same SQL, one round
# trip), then its removal, against the `select 1` round trip measured above.
c.execute("set synchronous_commit = on")
c.execute("create table sandpit_sessions (front text not null, id int8 not null, token text not null, primary key (front, id))")
c.execute("create index on sandpit_sessions (token)")
c.execute("create table sandpit_front_leases (front text primary key, expires_at timestamptz not null)")
c.execute("insert into sandpit_front_leases values ('f1', now() + interval '1 hour')")
ids = iter(range(1, 10 * n))
sync = "off"
def admit():
    i = next(ids)
    c.execute(
        f"BEGIN; SET LOCAL synchronous_commit = {sync}; SELECT pg_advisory_xact_lock(hashtextextended('sandpit-sessions:' || 'sp_x', 0)); "
        f"INSERT INTO sandpit_sessions (front, id, token) SELECT 'f1', {i}, 'sp_x' "
        "WHERE (SELECT count(*) FROM sandpit_sessions s JOIN sandpit_front_leases l ON l.front = s.front "
        "WHERE s.token = 'sp_x' AND l.expires_at > now()) < 100; COMMIT", prepare=False)
    c.execute(f"BEGIN; SET LOCAL synchronous_commit = {sync}; "
              f"DELETE FROM sandpit_sessions WHERE front = 'f1' AND id = {i}; COMMIT", prepare=False)
rows["select 1, again"] = timed(lambda: c.execute("select 1"))
print("per session start and end across fronts (admission + removal), ratio to select 1:")
for sync in ("off", "on"):
    v = timed(admit)
    print(f"  synchronous_commit {sync:<3} {v:9.1f} us  {v / rows['select 1, again']:8.1f} x"
          f"  (select 1: {rows['select 1, again']:.1f} us)")
EOF
