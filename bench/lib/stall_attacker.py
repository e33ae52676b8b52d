#!/usr/bin/env python3
"""The hostile token of the stall section: sends its worst message in a loop until killed.

stall_attacker.py DSN query N   -- one simple Query of N `SELECT 1;`, again and again
stall_attacker.py DSN pipeline N -- N pipelined Parse/Bind/Describe/Execute of `select 1`,
                                   one Sync at the end, again and again
Prints "ready" once connected, then one line per round: seconds it took.
"""
import sys
import time

import psycopg


def main():
    dsn, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c = psycopg.connect(dsn, autocommit=True)
    c.execute("select 1")
    print("ready", flush=True)
    q = ("SELECT 1;" * n).encode()
    while True:
        t0 = time.perf_counter()
        if mode == "query":
            # libpq's simple protocol: one Query message; results read and dropped.
            c.pgconn.send_query(q)
            while c.pgconn.get_result() is not None:
                pass
        else:
            # psycopg's pipeline mode reads while it writes, so a long burst cannot deadlock.
            cur = c.cursor()
            with c.pipeline():
                for _ in range(n):
                    cur.execute("select 1")
        print(f"{time.perf_counter() - t0:.3f}", flush=True)


if __name__ == "__main__":
    main()
