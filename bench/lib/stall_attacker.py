#!/usr/bin/env python3
"""The hostile token of the stall section: sends its worst message in a loop until killed.

stall_attacker.py DSN query N     -- one simple Query of N `SELECT 1;`, again and again
stall_attacker.py DSN pipeline N  -- N pipelined Parse/Bind/Describe/Execute of `select 1`,
                                     one Sync at the end, again and again
stall_attacker.py DSN connect N   -- N threads, each logging in, `select 1`, logging out, again
stall_attacker.py DSN slowloris N -- N sockets that each send a startup packet one byte a
                                     second (never finishing it), reopened when the gateway
                                     closes them
Prints "ready" once under way, then (query, pipeline) one line per round: seconds it took.
"""
import socket
import struct
import sys
import threading
import time

import psycopg


def logins(dsn, n):
    def loop():
        while True:
            try:
                with psycopg.connect(dsn, autocommit=True) as c:
                    c.execute("select 1").fetchone()
            except psycopg.Error:
                time.sleep(0.01)
    for _ in range(n):
        threading.Thread(target=loop, daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


def slowloris(dsn, n):
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    host, port = info.get("host", "127.0.0.1"), int(info.get("port", 5432))
    body = struct.pack("!i", 196608) + b"user\0" + info.get("user", "x").encode() + b"\0\0"
    packet = struct.pack("!i", len(body) + 4) + body
    socks = [None] * n
    print("ready", flush=True)
    sent = 0
    while True:
        for i in range(n):
            try:
                if socks[i] is None:
                    socks[i] = socket.create_connection((host, port), timeout=5)
                socks[i].send(packet[sent % (len(packet) - 1):sent % (len(packet) - 1) + 1])
            except OSError:
                if socks[i] is not None:
                    socks[i].close()
                socks[i] = None
        sent += 1
        time.sleep(1)


def main():
    dsn, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "connect":
        return logins(dsn, n)
    if mode == "slowloris":
        return slowloris(dsn, n)
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
