"""The client scenario with asyncpg (its own protocol implementation, no libpq), through the
gateway.

asyncpg speaks the extended protocol only: every query is a named prepared statement, each
Bind asks for binary results, a cursor is a portal fetched with Execute(max_rows), and a
statement timeout is a CancelRequest on a new connection.

In: SANDPIT_DSN (from `token issue`), SANDPIT_DSN_CLEARTEXT (agent / <id>.<secret>,
sslmode=require), SANDPIT_CAPS=1 to run the capped SELECT too.
Out: one `STEP <name> ok|fail|skip <detail>` line per step; exit 1 if any failed.
"""

import asyncio
import datetime
import decimal
import io
import json
import os
import sys

import asyncpg

DSN = os.environ["SANDPIT_DSN"]
CLEAR = os.environ["SANDPIT_DSN_CLEARTEXT"]
failed = False


async def step(name, fn):
    global failed
    try:
        detail = await fn() or ""
        print(f"STEP {name} ok {detail}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
        failed = True
        msg = f"{type(e).__name__}: {e}".replace("\n", " ")[:600]
        print(f"STEP {name} fail {msg}", flush=True)


def want(what, got, expected):
    if got != expected:
        raise AssertionError(f"{what}: got {got!r}, want {expected!r}")


async def connect(dsn=DSN, **kw):
    # The issued DSN names no sslmode: asyncpg's default (prefer) tries TLS first.
    return await asyncpg.connect(dsn, **kw)


class Conn:
    """`async with Conn() as c`: a connection closed however the block ends."""

    def __init__(self, dsn=DSN, **kw):
        self.dsn, self.kw = dsn, kw

    async def __aenter__(self):
        self.c = await connect(self.dsn, **self.kw)
        return self.c

    async def __aexit__(self, *exc):
        if not self.c.is_closed():
            await self.c.close(timeout=10)


async def connect_scram():
    async with Conn() as c:
        want("user", await c.fetchval("select current_user"), "agent")
    return "asyncpg's own SCRAM-SHA-256"


async def connect_tls_cleartext():
    async with Conn(CLEAR) as c:
        want("select", await c.fetchval("select 'in'"), "in")
        # The gateway refuses cleartext without TLS from loopback: this login used TLS.
    return "ssl=require"


async def create_table():
    async with Conn() as c:
        await c.execute("create table scenario(id int primary key, name text not null)")


async def insert_params():
    async with Conn() as c:
        await c.execute("insert into scenario values ($1, $2)", 1, "one")
        want("row", await c.fetchval("select name from scenario where id = $1", 1), "one")


async def prepared_reuse():
    async with Conn() as c:
        st = await c.prepare("insert into scenario values ($1, $2)")
        for i in (2, 3, 4):
            await st.fetch(i, f"n{i}")
        n = await c.fetchval("select count(*) from pg_prepared_statements")
        if n < 1:
            raise AssertionError("no prepared statement on the server")
        got = await c.fetchval("select count(*) from scenario where id between 2 and 4")
        want("count", got, 3)
    return f"{n} server-side prepared"


async def transaction_rollback():
    async with Conn() as c:
        tr = c.transaction()
        await tr.start()
        await c.execute("insert into scenario values (100, 'gone')")
        await tr.rollback()
        want("count", await c.fetchval("select count(*) from scenario where id = 100"), 0)


async def savepoint():
    async with Conn() as c:
        async with c.transaction():
            await c.execute("insert into scenario values (200, 'kept')")
            try:
                async with c.transaction():  # nested: a SAVEPOINT
                    await c.execute("insert into scenario values (201, 'undone')")
                    await c.execute("insert into scenario values (200, 'dup')")
            except asyncpg.UniqueViolationError:
                pass
        ids = [r[0] for r in await c.fetch("select id from scenario where id >= 200 order by id")]
        want("ids", ids, [200])


async def copy_in():
    async with Conn() as c:
        rows = [(i, f"copied {i}") for i in range(1000, 2000)]
        res = await c.copy_records_to_table("scenario", records=rows, columns=["id", "name"])
        want("status", res, "COPY 1000")
        got = await c.fetchval("select count(*) from scenario where name like 'copied %'")
        want("count", got, 1000)
    return "copy_records_to_table (binary COPY)"


async def copy_out():
    async with Conn() as c:
        buf = io.BytesIO()
        q = "select id, name from scenario where id between 1000 and 1999 order by id"
        res = await c.copy_from_query(q, output=buf, format="csv")
        want("status", res, "COPY 1000")
        lines = buf.getvalue().decode().splitlines()
        want("rows", len(lines), 1000)
        want("first", lines[0], "1000,copied 1000")


async def listen_notify():
    async with Conn() as a, Conn() as b:
        got = asyncio.get_running_loop().create_future()

        def on_notify(_conn, pid, channel, payload):
            if not got.done():
                got.set_result((channel, payload))

        await a.add_listener("scenario_ch", on_notify)
        await b.execute("notify scenario_ch, 'hello from B'")
        want("notification", await asyncio.wait_for(got, 10), ("scenario_ch", "hello from B"))


async def cancel():
    # asyncpg's timeout sends a CancelRequest on a connection of its own, then waits for the
    # statement's error; the session stays usable.
    async with Conn() as c:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            await c.execute("select pg_sleep(30)", timeout=1)
            raise AssertionError("pg_sleep(30) was not cancelled")
        except asyncio.TimeoutError:
            pass
        if loop.time() - start > 25:
            raise AssertionError("cancel took too long")
        want("after cancel", await c.fetchval("select 'alive'"), "alive")
        # And the cancel API's own SQLSTATE, from a statement cancelled by the server.
        try:
            await c.execute("set local statement_timeout = 1; select pg_sleep(5)")
            raise AssertionError("statement_timeout did not cancel pg_sleep(5)")
        except asyncpg.QueryCanceledError as e:
            want("sqlstate", e.sqlstate, "57014")
    return "timeout= (CancelRequest), then the session answers; 57014"


async def unique_violation():
    async with Conn() as c:
        try:
            await c.execute("insert into scenario values ($1, $2)", 1, "dup")
            raise AssertionError("no error")
        except asyncpg.UniqueViolationError as e:
            want("sqlstate", e.sqlstate, "23505")
            want("constraint", e.constraint_name, "scenario_pkey")
    return "UniqueViolationError, SQLSTATE 23505"


async def types_roundtrip():
    n = decimal.Decimal("12345678901234567890.000000012345")
    j = {"k": [1, 2.5, "x"], "n": None}
    ts = datetime.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=datetime.timezone.utc)
    b = bytes(range(256))
    a = [1, 2, None, 4]
    t = ["a b", "c,d", ""]
    async with Conn() as c:
        await c.execute("create table types(n numeric, j jsonb, ts timestamptz, b bytea, a int[], t text[])")
        await c.execute("insert into types values ($1, $2, $3, $4, $5, $6)", n, json.dumps(j), ts, b, a, t)
        row = await c.fetchrow("select n, j, ts, b, a, t from types")
        got = (row["n"], json.loads(row["j"]), row["ts"], row["b"], row["a"], row["t"])
        want("row", got, (n, j, ts, b, a, t))
    return "binary results"


async def cursor():
    async with Conn() as c:
        async with c.transaction():
            cur = await c.cursor("select g from generate_series(1, 1000) g")
            got = []
            while True:
                batch = await cur.fetch(150)
                if not batch:
                    break
                got.extend(r[0] for r in batch)
        want("rows", got, list(range(1, 1001)))
        async with c.transaction():
            n = [r[0] async for r in c.cursor("select generate_series(1, 700)", prefetch=100)]
        want("iterated", n, list(range(1, 701)))
    return "portal fetched 150 at a time; async for with prefetch=100"


async def notify_backend_pid():
    async with Conn() as c:
        pid = c.get_server_pid()
        want("pg_backend_pid()", await c.fetchval("select pg_backend_pid()"), pid)
        got = asyncio.get_running_loop().create_future()

        def on_notify(_conn, npid, channel, payload):
            if not got.done():
                got.set_result((channel, payload, npid))

        await c.add_listener("own_ch", on_notify)
        await c.execute("notify own_ch, 'mine'")
        want("notification", await asyncio.wait_for(got, 10), ("own_ch", "mine", pid))
    return "listener pid == get_server_pid()"


async def terminate_self():
    # asyncpg, against Postgres itself too, reports a FATAL that ends the session as
    # ConnectionDoesNotExistError carrying the server's message (it raises AdminShutdownError
    # only for an ErrorResponse): the message says whose FATAL arrived.
    c = await connect()
    try:
        pid = c.get_server_pid()
        try:
            await c.execute(f"select pg_terminate_backend({pid})")
            raise AssertionError("no error")
        except asyncpg.AdminShutdownError as e:
            want("sqlstate", e.sqlstate, "57P01")
        except asyncpg.ConnectionDoesNotExistError as e:
            if "terminating connection due to administrator command" not in str(e):
                raise AssertionError(f"not the backend's FATAL: {e}")
        want("closed", c.is_closed(), True)
    finally:
        c.terminate()
    return "pg_terminate_backend(get_server_pid()): the server's 57P01 message, connection closed"


async def two_phase():
    async with Conn() as c:
        mpt = int(await c.fetchval("show max_prepared_transactions"))
        if mpt == 0:
            print("STEP two_phase skip max_prepared_transactions is 0 on this server", flush=True)
            return None
        await c.execute("create table tpc_scenario(id int)")
        # asyncpg has no two-phase API: the SQL spelling, committed then rolled back.
        await c.execute("begin")
        await c.execute("insert into tpc_scenario values (1)")
        await c.execute("prepare transaction 'sandpit-asyncpg-1'")
        got = await c.fetch("select gid from pg_prepared_xacts")
        want("prepared", [r[0] for r in got], ["sandpit-asyncpg-1"])
        await c.execute("commit prepared 'sandpit-asyncpg-1'")
        await c.execute("begin")
        await c.execute("insert into tpc_scenario values (2)")
        await c.execute("prepare transaction 'sandpit-asyncpg-2'")
        await c.execute("rollback prepared 'sandpit-asyncpg-2'")
        want("rows", await c.fetchval("select count(*) from tpc_scenario"), 1)
        want("left prepared", await c.fetchval("select count(*) from pg_prepared_xacts"), 0)
    return f"PREPARE TRANSACTION / COMMIT PREPARED / ROLLBACK PREPARED (max_prepared_transactions = {mpt})"


async def write_returning_uncapped():
    async with Conn() as c:
        await c.execute("create table returning_scenario(id serial primary key, g int)")
        ids = await c.fetch("insert into returning_scenario(g) select g from generate_series(1, 500) g returning id")
        want("rows returned", len(ids), 500)
        rows = await c.fetch("update returning_scenario set g = -g returning id, g")
        want("update rows returned", len(rows), 500)
    return "INSERT/UPDATE … RETURNING of 500 rows under max_rows 200"


async def catalog_uncapped():
    async with Conn() as c:
        n = await c.fetchval("select count(*) from pg_catalog.pg_type")
        if n <= 200:
            raise AssertionError(f"pg_type has only {n} rows: the step needs more than 200")
        rows = await c.fetch("select oid, typname from pg_catalog.pg_type")
        want("pg_type rows", len(rows), n)
    return f"all {n} rows of pg_type under max_rows 200"


async def capped_select():
    notices = []
    async with Conn() as c:
        c.add_log_listener(lambda _c, m: notices.append(m.message))
        rows = await c.fetch("select * from generate_series(1, 100000)")
        await asyncio.sleep(0)  # log listeners are called soon after, not inline
    want("rows", len(rows), 200)
    if not notices:
        raise AssertionError("no NOTICE")
    return notices[0]


async def main():
    print(f"VERSION {asyncpg.__version__}", flush=True)
    await step("connect_scram", connect_scram)
    await step("connect_tls_cleartext", connect_tls_cleartext)
    print("STEP channel_binding skip asyncpg does not implement SCRAM-SHA-256-PLUS", flush=True)
    for name, fn in [
        ("create_table", create_table),
        ("insert_params", insert_params),
        ("prepared_reuse", prepared_reuse),
        ("transaction_rollback", transaction_rollback),
        ("savepoint", savepoint),
        ("copy_in", copy_in),
        ("copy_out", copy_out),
        ("listen_notify", listen_notify),
        ("cancel", cancel),
        ("unique_violation", unique_violation),
        ("types_roundtrip", types_roundtrip),
        ("cursor", cursor),
        ("notify_backend_pid", notify_backend_pid),
        ("terminate_self", terminate_self),
    ]:
        await step(name, fn)
    # Reported by itself when skipped (the server says why), else as a step.
    global failed
    try:
        detail = await two_phase()
        if detail is not None:
            print(f"STEP two_phase ok {detail}", flush=True)
    except Exception as e:  # noqa: BLE001 - reported as the step's failure
        failed = True
        print(f"STEP two_phase fail {type(e).__name__}: {e}".replace("\n", " ")[:600], flush=True)
    await step("write_returning_uncapped", write_returning_uncapped)
    await step("catalog_uncapped", catalog_uncapped)
    if os.environ.get("SANDPIT_CAPS") == "1":
        await step("capped_select", capped_select)
    else:
        print("STEP capped_select skip SANDPIT_CAPS is not 1", flush=True)


asyncio.run(main())
sys.exit(1 if failed else 0)
