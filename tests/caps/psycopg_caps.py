"""Row caps and the statement log as psycopg 3 sees them. Usage: psycopg_caps.py DSN"""
import sys

import psycopg

dsn = sys.argv[1]
notices = []
with psycopg.connect(dsn, autocommit=True) as conn:
    conn.add_notice_handler(lambda d: notices.append((d.sqlstate, d.message_primary)))
    # Server-side parameters: psycopg uses the extended protocol.
    rows = conn.execute("select id, v from big where id > %s order by id", (0,)).fetchall()
    assert len(rows) == 200, len(rows)
    assert rows[0][0] == 1 and rows[-1][0] == 200
    assert any(code == "01000" and "200 rows" in msg for code, msg in notices), notices
    # The session keeps working, and so does a transaction around a capped result.
    with conn.transaction():
        n = len(conn.execute("select * from big").fetchall())
        assert n == 200, n
        conn.execute("insert into notes(body) values (%s)", ("inside tx",))
    assert conn.execute("select count(*) from notes where body = 'inside tx'").fetchone()[0] == 1
    # Server-side cursor fetching 50 at a time: each FETCH is its own statement under the cap.
    with conn.transaction():
        with conn.cursor(name="c1") as cur:
            cur.itersize = 50
            cur.execute("select id from big where id <= 1000 order by id")
            got = [r[0] for r in cur]
    assert got == list(range(1, 1001)), (len(got), got[:3], got[-3:])
    # Pipeline mode.
    with conn.pipeline():
        c1 = conn.execute("select * from big")
        c2 = conn.execute("select 41 + 1")
        c3 = conn.execute("select id from big where id <= 3 order by id")
    assert len(c1.fetchall()) == 200
    assert c2.fetchone()[0] == 42
    assert [r[0] for r in c3.fetchall()] == [1, 2, 3]
print("psycopg caps ok")
