#!/usr/bin/env python3
"""Writes the hand-made seeds of the pipeline_caps target (fuzz/corpus/pipeline_caps/).
Input format: one mode byte (caps), then messages, each a direction byte (0 client,
1 backend; +2 = no outbox drain after it) followed by one protocol frame."""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "pipeline_caps")


def fr(tag, body=b""):
    return tag + struct.pack(">i", len(body) + 4) + body


def cs(s):
    return s.encode() + b"\0"


def C(f):  # from the client
    return b"\0" + f


def B(f):  # from the backend
    return b"\1" + f


Q = lambda sql: C(fr(b"Q", cs(sql)))
P = lambda name, sql: C(fr(b"P", cs(name) + cs(sql) + b"\0\0"))
BIND = lambda portal, stmt: C(fr(b"B", cs(portal) + cs(stmt) + b"\0\0\0\0\0\0"))
DESC = lambda portal: C(fr(b"D", b"P" + cs(portal)))
EXE = lambda portal, n: C(fr(b"E", cs(portal) + struct.pack(">i", n)))
SYNC = C(fr(b"S"))
CD = lambda d: C(fr(b"d", d))
CDONE = C(fr(b"c"))
T = B(fr(b"T", struct.pack(">h", 1) + cs("g") + struct.pack(">ihihih", 0, 0, 25, -1, -1, 0)))
D = lambda v="1": B(fr(b"D", struct.pack(">hi", 1, len(v)) + v.encode()))
CC = lambda tag: B(fr(b"C", cs(tag)))
Z = B(fr(b"Z", b"I"))
ONE, TWO, NODATA, SUSP = (B(fr(t)) for t in (b"1", b"2", b"n", b"s"))
ERR = lambda code: B(fr(b"E", b"SERROR\0C" + cs(code) + b"Mbackend error\0\0"))
G = B(fr(b"G", b"\0\0\1\0\0"))
H = B(fr(b"H", b"\0\0\1\0\0"))
BD = lambda d: B(fr(b"d", d))

TRUNC2, ERR2 = 0x31, 0x31 | 1  # 2 rows / 256 bytes; truncate or error mode

SEEDS = {
    "simple_capped": [TRUNC2, Q("SELECT g FROM t"), ONE, TWO, T, D(), D(), D(), SUSP, Z],
    "error_mode": [ERR2, Q("SELECT 1; SELECT g FROM t"), ONE, TWO, T, D(), CC("SELECT 1"),
                   ONE, TWO, T, D(), D(), D(), SUSP, ONE, TWO, ERR("54000"), Z],
    "whole_query": [TRUNC2, Q("SELECT 'BEGIN ATOMIC'; SELECT g FROM t; SELECT g FROM t")]
    + [T, D(), D(), D(), D(), CC("SELECT 4")] * 3 + [Z],
    "stray": [TRUNC2, D(), D(), D(), CC("SELECT 3"), D(), D(), D(), Z],
    "extended": [ERR2, P("", "SELECT g FROM t"), BIND("", ""), DESC(""), EXE("", 0), SYNC,
                 ONE, TWO, T, D(), D(), D(), SUSP, Z],
    "cursor_fetch": [TRUNC2, P("", "SELECT g FROM t"), BIND("", ""), EXE("", 1), EXE("", 1), SYNC,
                     ONE, TWO, D(), SUSP, D(), SUSP, Z],
    "copy_in_syncs": [TRUNC2, Q("COPY t FROM STDIN"), G, CD(b"1\n"), SYNC, SYNC, CDONE,
                      CC("COPY 1"), Z, Q("SELECT g FROM t"), ONE, TWO, T, D(), D(), D(), SUSP, Z],
    "copy_out": [TRUNC2, Q("COPY t TO STDOUT"), H] + [BD(b"x" * 60 + b"\n")] * 5
    + [B(fr(b"c")), CC("COPY 5"), Z],
    "parse_twice": [TRUNC2, P("s", "DELETE FROM t RETURNING g"), SYNC, P("s", "SELECT 1"), SYNC,
                    BIND("", "s"), EXE("", 0), SYNC, ONE, Z, ERR("42P05"), Z, TWO,
                    D(), D(), D(), CC("DELETE 3"), Z],
    "interleaved": [TRUNC2, D(), D(), Q("SELECT g FROM t"), D(), D(), CC("SELECT 4"), ONE, TWO,
                    T, D(), D(), D(), SUSP, Z],
    "no_drain": [TRUNC2, Q("SELECT 1; SELECT 2"), b"\2" + fr(b"S"), ONE, TWO, T, D(),
                 CC("SELECT 1"), ONE, TWO, T, D(), CC("SELECT 1"), Z],
    "policy": [0x31 | 2, Q("DELETE FROM t RETURNING g"), ERR("42501"), Z, Q("SELECT g FROM t"),
               ONE, TWO, T, D(), D(), D(), SUSP, Z],
}

os.makedirs(OUT, exist_ok=True)
for name, parts in SEEDS.items():
    data = bytes([parts[0]]) + b"".join(parts[1:])
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(SEEDS)} seeds in {OUT}")
