#!/usr/bin/env python3
"""Load generator: N concurrent tokens, each its own task, each doing a mixed read/write
workload through the gateway for a bounded time. Every task writes marker rows into the same
table name and checks, on every read, that it only ever sees its own markers.

Prints one JSON object with the figures. Exit status 1 if any task saw another task's rows,
or any statement failed.
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import urllib.request

import psycopg


def issue(api, key, task, ttl):
    body = json.dumps({"task": task, "ttl_seconds": ttl, "max_rows": 1000}).encode()
    req = urllib.request.Request(
        f"{api}/v1/tokens",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


class Stats:
    def __init__(self):
        self.ops = 0
        self.errors = []
        self.cross = 0
        self.lat = []
        self.connect = []


async def task_main(i, dsn, phase, stats):
    """Connect (a cold fork), wait until every task is connected, then run until the deadline."""
    task = f"load-{i}"
    t0 = time.monotonic()
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=900)
    except Exception as e:  # noqa: BLE001 - report every failure
        stats.errors.append(f"{task}: connect: {e}")
        phase.arrived()
        return
    stats.connect.append(time.monotonic() - t0)
    phase.arrived()
    await phase.go.wait()
    deadline = phase.deadline
    rng = random.Random(i)
    written = 0
    async with conn:
        try:
            await conn.execute("create table if not exists markers(task text not null, n int not null)")
            while time.monotonic() < deadline:
                op = rng.random()
                s = time.monotonic()
                if op < 0.35:
                    written += 1
                    await conn.execute("insert into markers values (%s, %s)", (task, written))
                elif op < 0.70:
                    cur = await conn.execute("select distinct task from markers")
                    seen = {r[0] for r in await cur.fetchall()}
                    if seen - {task}:
                        stats.cross += 1
                        stats.errors.append(f"{task} saw {sorted(seen - {task})[:3]}")
                elif op < 0.85:
                    lo = rng.randint(1, 900)
                    cur = await conn.execute(
                        "select count(*), sum(id) from items where id between %s and %s", (lo, lo + 99)
                    )
                    await cur.fetchone()
                else:
                    async with conn.transaction():
                        await conn.execute("update items set name = %s where id = %s", (task, rng.randint(1, 1000)))
                        cur = await conn.execute("select count(*) from items where name like 'load-%%' and name <> %s", (task,))
                        (others,) = await cur.fetchone()
                        if others:
                            stats.cross += 1
                            stats.errors.append(f"{task} saw {others} items renamed by other tasks")
                stats.lat.append(time.monotonic() - s)
                stats.ops += 1
            cur = await conn.execute("select count(*), count(*) filter (where task <> %s) from markers", (task,))
            total, foreign = await cur.fetchone()
            if total != written or foreign:
                stats.cross += 1
                stats.errors.append(f"{task}: wrote {written}, table has {total} ({foreign} foreign)")
        except Exception as e:  # noqa: BLE001
            stats.errors.append(f"{task}: {type(e).__name__}: {e}")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", required=True)
    ap.add_argument("--admin-key", required=True)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--duration", type=float, default=60)
    args = ap.parse_args()

    t0 = time.monotonic()
    dsns = [issue(args.api, args.admin_key, f"load-{i}", 3600)["dsn"] for i in range(args.tokens)]
    issued = time.monotonic() - t0
    stats = Stats()

    class Phase:
        go = asyncio.Event()
        left = args.tokens
        deadline = 0.0

        @classmethod
        def arrived(cls):
            cls.left -= 1
            if cls.left == 0:
                cls.deadline = time.monotonic() + args.duration
                cls.go.set()

    t1 = time.monotonic()
    tasks = [asyncio.create_task(task_main(i, dsns[i], Phase, stats)) for i in range(args.tokens)]
    await Phase.go.wait()
    connect_all = time.monotonic() - t1
    start = time.monotonic()
    await asyncio.gather(*tasks)
    wall = time.monotonic() - start
    lat = sorted(stats.lat) or [0.0]
    out = {
        "tokens": args.tokens,
        "duration_s": args.duration,
        "wall_s": round(wall, 1),
        "issue_s": round(issued, 1),
        "connect_all_s": round(connect_all, 1),
        "connected": len(stats.connect),
        "connect_p50_ms": round(statistics.median(stats.connect) * 1000, 1) if stats.connect else None,
        "connect_max_ms": round(max(stats.connect) * 1000, 1) if stats.connect else None,
        "ops": stats.ops,
        "ops_per_s": round(stats.ops / wall, 1),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2),
        "cross_task_reads": stats.cross,
        "errors": len(stats.errors),
        "first_errors": stats.errors[:10],
    }
    print(json.dumps(out))
    return 0 if not stats.errors and stats.cross == 0 and len(stats.connect) == args.tokens else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
