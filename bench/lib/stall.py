"""One token's worst message against another token's latency (issue 14: no token can
stall another). Figures only: the ratio to the idle latency measured in the same run."""
import os
import subprocess
import sys
import time

import psycopg

import benchlib as bl
from benchlib import Row, log, pct
from shared_gateway import MAIN, shared  # the suite's shared gateway

HERE = os.path.dirname(os.path.abspath(__file__))


# One query every PACE seconds: the samples span several of the attacker's rounds instead
# of a burst of a few milliseconds, and the idle figure is taken the same way.
PACE = 0.01


def _select1_ms(conn, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.execute("select 1").fetchone()
        dt = time.perf_counter() - t0
        out.append(dt * 1000)
        time.sleep(max(0.0, PACE - dt))
    return out


def _logins_ms(dsn, n):
    return [bl.first_query(dsn) for _ in range(n)]


def _attack(env, dsn, mode, n):
    """Start the attacker (nice 19 on the client core, so it takes CPU from the measuring
    client only when that one is idle) and wait until its first round is under way."""
    p = subprocess.Popen(env.client_cmd(["nice", "-n", "19", sys.executable,
                                         os.path.join(HERE, "stall_attacker.py"), dsn, mode, str(n)]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    env.procs.append(p)
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.kill()
        raise RuntimeError(f"attacker did not start: {line!r} {p.stderr.read()[-300:]!r}")
    time.sleep(0.5)
    return p


def _stop(ps):
    rounds = []
    for p in ps:
        p.kill()
        out, _ = p.communicate(timeout=30)
        rounds += [float(x) for x in out.split() if x.replace(".", "", 1).isdigit()]
    return rounds


def stall(env, sz):
    env.pin_self_to_clients()
    g = shared(env, MAIN)
    victim = g.issue("stall-victim")
    n, logins = sz["stall_queries"], sz["stall_logins"]
    # (mode, count, attacker processes, whether a control straight to the scratch server
    # makes sense, what it is)
    attacks = [
        ("query", sz["stall_stmts"], 1, True, f"one simple Query of {sz['stall_stmts']:,} `SELECT 1;` "
         "(over the split bound: relayed whole, capped from the stream)"),
        ("query", 1000, 1, True, "one simple Query of 1,000 `SELECT 1;` (the most the gateway runs "
         "one by one: 1,000 Parse/Bind/Describe/Execute)"),
        ("pipeline", sz["stall_burst"], 1, True, f"a pipelined burst of {sz['stall_burst']:,} "
         "Parse/Bind/Describe/Execute `select 1`, one Sync"),
        ("pipeline", 10_000, 2, True, "two sessions, each pipelining 10,000 "
         "Parse/Bind/Describe/Execute `select 1` and a Sync, in a loop"),
        ("connect", 8, 1, True, "8 threads logging in, `select 1`, logging out, in a loop"),
        ("slowloris", 200, 1, False, "200 sockets each sending a startup packet one byte a second"),
    ]
    rows = []
    with psycopg.connect(victim["dsn_plain"], autocommit=True) as vc:
        _select1_ms(vc, 100)  # warm up (the scratch server was just forked)
        _logins_ms(victim["dsn_plain"], 3)
        # Idle is measured before and after the attacks and pooled (the machine is shared).
        idle = _select1_ms(vc, n)
        idle_login = _logins_ms(victim["dsn_plain"], logins)
        busy_rows = []
        attackers = []
        for i, (mode, count, procs, control, what) in enumerate(attacks):
            # A fresh attacker token per attack: on a fast machine the floods write hundreds
            # of thousands of statements, enough to fill one token's log quota (58030).
            attacker = g.issue(f"stall-attacker-{i}")
            attackers.append(attacker)
            bl.first_query(attacker["dsn_plain"])  # fork its scratch server now
            if env.root:
                _, sock = g.postmaster(attacker["id"])
                direct_dsn = f"host={sock} port=5432 user=agent dbname=sandpit"
            # Control: the same attack straight to the attacker's scratch server, so the
            # share of plain CPU contention on the server core is visible.
            direct = None
            if env.root and control:
                ps = [_attack(env, direct_dsn, mode, count) for _ in range(procs)]
                try:
                    direct = _select1_ms(vc, n)
                finally:
                    _stop(ps)
            ps = [_attack(env, attacker["dsn_plain"], mode, count) for _ in range(procs)]
            try:
                busy = _select1_ms(vc, n)
                busy_login = _logins_ms(victim["dsn_plain"], logins)
            finally:
                rounds = _stop(ps)
            per_round = f"attacker's round {pct(rounds, 50):.2f} s median over {len(rounds)}" if rounds else ""
            log(f"stall {mode} {count}: select1 {pct(busy, 50):.2f}/{pct(busy, 99):.2f} ms, "
                f"login {pct(busy_login, 50):.1f} ms; {per_round}")
            busy_rows.append((what, busy, busy_login, per_round, direct))
        idle_after = _select1_ms(vc, n)
        idle_login += _logins_ms(victim["dsn_plain"], logins)
        i50, i99 = pct(idle + idle_after, 50), pct(idle + idle_after, 99)
        l50 = pct(idle_login, 50)
        rows.append(Row(f"another token's `select 1`, idle (n={2 * n}, one every {PACE * 1000:.0f} ms)",
                        f"{i50:.2f} / {i99:.2f} ms", "",
                        f"baseline of the ratios below; before / after the attacks: "
                        f"{pct(idle, 50):.2f} / {pct(idle_after, 50):.2f} ms median, "
                        f"{pct(idle, 99):.2f} / {pct(idle_after, 99):.2f} ms p99"))
        rows.append(Row(f"another token's login + `select 1`, idle (n={2 * logins})",
                        f"{l50:.1f} / {pct(idle_login, 99):.1f} ms", "", ""))
        for what, busy, busy_login, per_round, direct in busy_rows:
            b50, b99 = pct(busy, 50), pct(busy, 99)
            rows.append(Row(f"another token's `select 1` (n={n}) while one token sends {what}",
                            f"{b50:.2f} / {b99:.2f} ms: ×{b50 / i50:.1f} / ×{b99 / i99:.1f} idle",
                            "", f"figures only; {per_round}"))
            if direct:
                d50, d99 = pct(direct, 50), pct(direct, 99)
                rows.append(Row("… control: the same attack sent straight to the attacker's scratch "
                                "server (no gateway on its path)",
                                f"{d50:.2f} / {d99:.2f} ms: ×{d50 / i50:.1f} / ×{d99 / i99:.1f} idle", "", ""))
            rows.append(Row(f"… and its login + `select 1` meanwhile (n={logins})",
                            f"{pct(busy_login, 50):.1f} / {pct(busy_login, 99):.1f} ms: "
                            f"×{pct(busy_login, 50) / l50:.1f} / ×{pct(busy_login, 99) / pct(idle_login, 99):.1f} idle",
                            "", ""))
    g.revoke(victim["id"])
    for attacker in attackers:
        g.revoke(attacker["id"])
    return rows
