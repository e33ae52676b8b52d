"""The client scenario with psycopg 3 (libpq underneath), through the gateway.

In: SANDPIT_DSN (from `token issue`), SANDPIT_DSN_CLEARTEXT (agent / <id>.<secret>,
sslmode=require), SANDPIT_CAPS=1 to run the capped SELECT too.
Out: one `STEP <name> ok|fail|skip <detail>` line per step; exit 1 if any failed.
"""

import datetime
import decimal
import os
import sys
import threading
import time

import psycopg
from psycopg import errors, sql
from psycopg.types.json import Jsonb

import orm_steps  # tests/clients/orm_steps.py, beside this file

DSN = os.environ["SANDPIT_DSN"]
CLEAR = os.environ["SANDPIT_DSN_CLEARTEXT"]
failed = False


def step(name):
    def wrap(fn):
        global failed
        try:
            detail = fn() or ""
            print(f"STEP {name} ok {detail}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
            failed = True
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:600]
            print(f"STEP {name} fail {msg}", flush=True)
        return fn

    return wrap


def want(what, got, expected):
    if got != expected:
        raise AssertionError(f"{what}: got {got!r}, want {expected!r}")


def connect(dsn=DSN, **kw):
    return psycopg.connect(dsn, **kw)


print(f"VERSION {psycopg.__version__} (libpq {psycopg.pq.version() // 10000}.{psycopg.pq.version() % 100})")


@step("connect_scram")
def _():
    with connect() as c:
        want("user", c.execute("select current_user").fetchone()[0], "agent")


@step("connect_tls_cleartext")
def _():
    with connect(CLEAR) as c:
        want("ssl", c.pgconn.ssl_in_use, True)
        want("select", c.execute("select 'in'").fetchone()[0], "in")


@step("channel_binding")
def _():
    with connect(DSN + "?sslmode=require&channel_binding=require") as c:
        want("select", c.execute("select 1").fetchone()[0], 1)
    return "channel_binding=require"


def cancel_running(c, watcher, marker):
    """Runs `pg_sleep(30) /* marker */` on `c` and cancels it with cancel_safe() once the
    watcher sees it active; returns the QueryCanceled error (raises if anything else)."""
    problems = []

    def cancel_when_running():
        try:
            for _ in range(200):
                n = watcher.execute(
                    "select count(*) from pg_stat_activity where state = 'active' "
                    f"and query like '%{marker}%' and pid <> pg_backend_pid()"
                ).fetchone()[0]
                if n:
                    # libpq 17+'s PQcancelCreate path: waits for the server to close.
                    c.cancel_safe(timeout=10)
                    return
                time.sleep(0.05)
            problems.append("the statement never became active")
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            problems.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=cancel_when_running)
    t.start()
    start = time.monotonic()
    cancelled = None
    try:
        c.execute(f"select pg_sleep(30) /* {marker} */")
    except errors.QueryCanceled as e:
        cancelled = e
    finally:
        t.join()
    if problems:
        raise AssertionError(f"cancel_safe(): {problems[0]}")
    if cancelled is None:
        raise AssertionError("pg_sleep(30) was not cancelled")
    if time.monotonic() - start > 25:
        raise AssertionError("cancel took too long")
    return cancelled


@step("direct_tls")
def _():
    # libpq 17+ opens with the TLS ClientHello (ALPN "postgresql"), no SSLRequest first.
    if psycopg.pq.version() < 170000:
        raise AssertionError(f"libpq {psycopg.pq.version()} has no sslnegotiation=direct")
    with connect(CLEAR + "&sslnegotiation=direct") as c, connect(autocommit=True) as watcher:
        want("ssl", c.pgconn.ssl_in_use, True)
        want("select", c.execute("select 'direct'").fetchone()[0], "direct")
        # The cancel request goes over direct TLS too.
        want("sqlstate", cancel_running(c, watcher, "direct cancel").sqlstate, "57014")
    return "sslnegotiation=direct, cancel_safe() over it"


@step("create_table")
def _():
    with connect() as c:
        c.execute("create table scenario(id int primary key, name text not null)")


@step("insert_params")
def _():
    with connect() as c:
        c.execute("insert into scenario values (%s, %s)", (1, "one"))
        want("row", c.execute("select name from scenario where id = %s", (1,)).fetchone()[0], "one")


@step("prepared_reuse")
def _():
    with connect() as c:
        for i in (2, 3, 4):
            # prepare=True: a named server-side statement, executed again for each row.
            c.execute("insert into scenario values (%s, %s)", (i, f"n{i}"), prepare=True)
        n = c.execute("select count(*) from pg_prepared_statements").fetchone()[0]
        if n < 1:
            raise AssertionError("no prepared statement on the server")
        want("count", c.execute("select count(*) from scenario where id between 2 and 4").fetchone()[0], 3)
    return f"{n} server-side prepared"


@step("transaction_rollback")
def _():
    with connect() as c:
        with c.transaction(force_rollback=True):
            c.execute("insert into scenario values (100, 'gone')")
        want("count", c.execute("select count(*) from scenario where id = 100").fetchone()[0], 0)


@step("savepoint")
def _():
    with connect() as c:
        with c.transaction():
            c.execute("insert into scenario values (200, 'kept')")
            try:
                with c.transaction():  # nested: a SAVEPOINT
                    c.execute("insert into scenario values (201, 'undone')")
                    c.execute("insert into scenario values (200, 'dup')")
            except errors.UniqueViolation:
                pass
        ids = [r[0] for r in c.execute("select id from scenario where id >= 200 order by id")]
        want("ids", ids, [200])


@step("copy_in")
def _():
    with connect() as c:
        with c.cursor().copy("copy scenario (id, name) from stdin") as cp:
            for i in range(1000, 2000):
                cp.write_row((i, f"copied {i}"))
        want("count", c.execute("select count(*) from scenario where name like 'copied %'").fetchone()[0], 1000)


@step("copy_out")
def _():
    with connect() as c:
        with c.cursor().copy("copy (select id, name from scenario where id between 1000 and 1999 order by id) to stdout") as cp:
            rows = [tuple(r) for r in cp.rows()]
        want("rows", len(rows), 1000)
        want("first", rows[0], ("1000", "copied 1000"))


@step("listen_notify")
def _():
    with connect(autocommit=True) as a, connect(autocommit=True) as b:
        a.execute("listen scenario_ch")
        b.execute("notify scenario_ch, 'hello from B'")
        got = [(n.channel, n.payload) for n in a.notifies(timeout=10, stop_after=1)]
        want("notifications", got, [("scenario_ch", "hello from B")])


@step("cancel")
def _():
    # The watcher is in autocommit: pg_stat_activity is a snapshot per transaction.
    with connect() as c, connect(autocommit=True) as watcher:
        want("sqlstate", cancel_running(c, watcher, "to cancel").sqlstate, "57014")
    return "cancel_safe(), SQLSTATE 57014"


@step("unique_violation")
def _():
    with connect() as c:
        try:
            c.execute("insert into scenario values (%s, %s)", (1, "dup"))
            raise AssertionError("no error")
        except errors.UniqueViolation as e:
            want("sqlstate", e.sqlstate, "23505")
            want("constraint", e.diag.constraint_name, "scenario_pkey")
    return "UniqueViolation, SQLSTATE 23505"


@step("types_roundtrip")
def _():
    n = decimal.Decimal("12345678901234567890.000000012345")
    j = {"k": [1, 2.5, "x"], "n": None}
    ts = datetime.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=datetime.timezone.utc)
    b = bytes(range(256))
    a = [1, 2, None, 4]
    t = ["a b", "c,d", ""]
    with connect() as c:
        c.execute("create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])")
        c.execute("insert into types values (%s, %s, %s, %s, %s, %s)", (n, Jsonb(j), ts, b, a, t))
        for binary in (False, True):
            row = c.cursor(binary=binary).execute("select n, j, ts, b, a, t from types").fetchone()
            want(f"row (binary={binary})", row, (n, j, ts, b, a, t))
    return "text and binary"


@step("cursor")
def _():
    with connect() as c:
        with c.cursor(name="scenario_cur") as cur:
            cur.itersize = 150
            cur.execute("select g from generate_series(1, 1000) g")
            got = []
            while True:
                batch = cur.fetchmany(150)
                if not batch:
                    break
                got.extend(r[0] for r in batch)
        want("rows", got, list(range(1, 1001)))
    return "named cursor, fetchmany(150)"


@step("pipeline")
def _():
    with connect() as c:
        with c.pipeline():
            curs = [c.execute("insert into scenario values (%s, %s) returning id", (i, "piped")) for i in range(3000, 3100)]
            bad = c.cursor()
            c.execute("select count(*) from scenario where name = 'piped'")
        got = [cur.fetchone()[0] for cur in curs]
        want("returned ids", got, list(range(3000, 3100)))
        c.commit()
        # An error inside a pipeline arrives with its SQLSTATE and aborts the rest.
        try:
            with c.pipeline():
                c.execute("insert into scenario values (3000, 'dup')")
                bad.execute("select 1")
            raise AssertionError("no error")
        except errors.UniqueViolation:
            c.rollback()
        want("count", c.execute("select count(*) from scenario where name = 'piped'").fetchone()[0], 100)
    return "100 statements in one pipeline"


@step("notify_backend_pid")
def _():
    with connect(autocommit=True) as c:
        pid = c.info.backend_pid
        want("pg_backend_pid()", c.execute("select pg_backend_pid()").fetchone()[0], pid)
        c.execute("listen own_ch")
        c.execute("notify own_ch, 'mine'")
        got = [(n.channel, n.payload, n.pid) for n in c.notifies(timeout=10, stop_after=1)]
        want("notification", got, [("own_ch", "mine", pid)])
    return "Notify.pid == conn.info.backend_pid"


@step("terminate_self")
def _():
    c = connect(autocommit=True)
    try:
        pid = c.info.backend_pid
        try:
            c.execute("select pg_terminate_backend(%s)", (pid,))
            raise AssertionError("no error")
        except errors.AdminShutdown as e:
            want("sqlstate", e.sqlstate, "57P01")
        want("closed", c.closed, True)
    finally:
        c.close()
    return "pg_terminate_backend(conn.info.backend_pid) raises AdminShutdown (57P01)"


def two_phase():
    with connect() as c:
        mpt = int(c.execute("show max_prepared_transactions").fetchone()[0])
        c.rollback()
        if mpt == 0:
            print("STEP two_phase skip max_prepared_transactions is 0 on this server", flush=True)
            return
        c.execute("create table tpc_scenario(id int)")
        c.commit()

        @step("two_phase")
        def _():
            xid = c.xid(1, "sandpit-scenario", "branch-1")
            c.tpc_begin(xid)
            c.execute("insert into tpc_scenario values (1)")
            c.tpc_prepare()
            with connect(autocommit=True) as other:
                got = other.execute("select gid from pg_prepared_xacts").fetchall()
                if len(got) != 1:
                    raise AssertionError(f"pg_prepared_xacts: {got}")
            c.tpc_commit()
            want("committed rows", c.execute("select count(*) from tpc_scenario").fetchone()[0], 1)
            c.commit()
            # And the SQL spelling, with a rollback this time.
            c.autocommit = True
            c.execute("begin")
            c.execute("insert into tpc_scenario values (2)")
            c.execute("prepare transaction 'sandpit-sql'")
            c.execute("rollback prepared 'sandpit-sql'")
            want("rows", c.execute("select count(*) from tpc_scenario").fetchone()[0], 1)
            want("left prepared", c.execute("select count(*) from pg_prepared_xacts").fetchone()[0], 0)
            return f"tpc_begin/prepare/commit and PREPARE TRANSACTION/ROLLBACK PREPARED (max_prepared_transactions = {mpt})"


try:
    two_phase()
except Exception as e:  # noqa: BLE001 - reported as the step's failure
    failed = True
    print(f"STEP two_phase fail {type(e).__name__}: {e}".replace("\n", " ")[:600], flush=True)


@step("write_returning_uncapped")
def _():
    with connect() as c:
        c.execute("create table returning_scenario(id serial primary key, g int)")
        cur = c.execute("insert into returning_scenario(g) select g from generate_series(1, 500) g returning id")
        ids = [r[0] for r in cur.fetchall()]
        want("rows returned", len(ids), 500)
        want("rowcount", cur.rowcount, 500)
        cur = c.execute("update returning_scenario set g = -g returning id, g")
        want("update rows returned", len(cur.fetchall()), 500)
        c.commit()
    return "INSERT/UPDATE … RETURNING of 500 rows under max_rows 200"


@step("catalog_uncapped")
def _():
    with connect() as c:
        n = c.execute("select count(*) from pg_catalog.pg_type").fetchone()[0]
        if n <= 200:
            raise AssertionError(f"pg_type has only {n} rows: the step needs more than 200")
        rows = c.execute("select oid, typname from pg_catalog.pg_type").fetchall()
        want("pg_type rows", len(rows), n)
    return f"all {n} rows of pg_type under max_rows 200"


@step("orm_django_bulk_create")
def _():
    return orm_steps.django_bulk_create(DSN)


@step("orm_sqlalchemy_flush")
def _():
    return orm_steps.sqlalchemy_flush(DSN)


if os.environ.get("SANDPIT_CAPS") == "1":

    @step("capped_select")
    def _():
        notices = []
        with connect() as c:
            c.add_notice_handler(lambda d: notices.append(d.message_primary))
            rows = c.execute("select * from generate_series(1, 100000)").fetchall()
        want("rows", len(rows), 200)
        if not notices:
            raise AssertionError("no NOTICE")
        return notices[0]

else:
    print("STEP capped_select skip SANDPIT_CAPS is not 1")

sys.exit(1 if failed else 0)
