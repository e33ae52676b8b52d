"""Relay cost per transaction, counted: instructions (callgrind) and syscalls (strace) of the
proxy process for one `pgbench -S -c 1` transaction, sandpit (statement log on and off) beside
PgBouncer in session mode, in front of the same scratch server.

Counts, not times: they do not depend on the shared machine's load. Each figure is
(count over a run of N transactions - count over a run of 1 transaction) / (N - 1), so the
connection's own cost (SCRAM, backend login) is taken out and what is left is the relay's
cost per transaction. The gateway runs under callgrind with instrumentation off until the measured run
(`--instr-atstart=no`, `callgrind_control -i on/off`); PgBouncer is counted over whole
processes (see `relay`), the difference again leaving only the transactions; strace attaches to every thread of
the proxy (`strace -c -f -p`) for the measured run only. The syscall figures come from a
native run (valgrind adds syscalls of its own)."""
import copy
import os
import re
import shutil
import signal
import subprocess
import time

import benchlib as bl
from benchlib import Row, log

MODES = ["simple", "extended", "prepared"]
TARGET_IR = 2.5  # sandpit log on ≤ 2.5 × PgBouncer's instructions per transaction
TARGET_SYSCALLS = 1.0  # … and ≤ PgBouncer's syscalls + 1


def _sections():
    import sections  # imported late: it pulls in psycopg and the other sections
    return sections


def _valgrind_argv(out_file, whole=False):
    start = ["--vgdb=no"] if whole else ["--instr-atstart=no"]
    return ["valgrind", "--tool=callgrind", *start, "--quiet", f"--callgrind-out-file={out_file}"]


def _wrapper(env, binary, out_file):
    """An executable that runs the gateway under callgrind (Gateway starts `env.binary`)."""
    path = os.path.join(env.dir, "sandpit-under-callgrind")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec " + " ".join(_valgrind_argv(out_file)) + f" {binary} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def _pgbench(env, dsn, mode, n):
    r = subprocess.run(env.client_cmd([_sections().pgbin("pgbench"), "-n", "-S", "-M", mode, "-c", "1",
                                       "-t", str(n), dsn]), capture_output=True, text=True)
    if r.returncode != 0 or "number of failed transactions: 0" not in r.stdout:
        raise RuntimeError(f"pgbench {mode} -t {n} failed: {r.stdout[-200:]} {r.stderr[-300:]}")


def _callgrind_total(pid, out_file, env, dsn, mode, n):
    """Instructions the process `pid` (under callgrind) ran during one pgbench run."""
    def ctl(*args):
        subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)
    ctl("-z")
    ctl("-i", "on")
    _pgbench(env, dsn, mode, n)
    ctl("-i", "off")
    before = set(_dumps(out_file))
    ctl("-d")
    deadline = time.time() + 60
    while time.time() < deadline:
        new = [p for p in _dumps(out_file) if p not in before]
        if new:
            total = _totals(new[0])
            if total is not None:
                os.unlink(new[0])
                return total
        time.sleep(0.1)
    raise RuntimeError("callgrind dump did not appear")


def _dumps(out_file):
    d, base = os.path.split(out_file)
    return [os.path.join(d, f) for f in os.listdir(d) if f.startswith(base + ".")]


def _totals(path):
    """The `totals:` line of a callgrind file (a dump's `summary:` can be 0), once written."""
    try:
        for ln in open(path):
            if ln.startswith("totals:"):
                return int(ln.split()[1])
    except OSError:
        pass
    return None


def _strace_total(pid, env, dsn, mode, n):
    """System calls of every thread of `pid` during one pgbench run."""
    out = os.path.join(env.dir, f"strace-{pid}-{time.time_ns()}")
    err = open(out + ".err", "w+")
    p = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out], stderr=err)
    deadline = time.time() + 30
    while "attached" not in open(out + ".err").read():
        if time.time() > deadline or p.poll() is not None:
            raise RuntimeError("strace did not attach: " + open(out + ".err").read()[-300:])
        time.sleep(0.05)
    time.sleep(0.3)  # the other threads' attach messages follow the first
    try:
        _pgbench(env, dsn, mode, n)
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(60)
    for ln in open(out):
        f = ln.split()
        if f and f[-1] == "total":
            return int(f[3])
    raise RuntimeError("no strace summary: " + open(out).read()[-300:])


def _per_tx(count, env, dsn, mode, n):
    """(count(N) - count(1)) / (N - 1): the connection's own cost taken out."""
    _pgbench(env, dsn, mode, 50)  # warm-up: caches, the classification cache
    one = count(env, dsn, mode, 1)
    many = count(env, dsn, mode, n)
    return (many - one) / (n - 1)


def _bouncer_pid(d):
    deadline = time.time() + 60
    path = os.path.join(d, "pgbouncer.pid")
    while time.time() < deadline:
        try:
            return int(open(path).read().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.05)
    raise RuntimeError("no pgbouncer pid file")


def _stop_bouncer(p, d):
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    pid_file = os.path.join(d, "pgbouncer.pid")
    if os.path.exists(pid_file):
        os.unlink(pid_file)


def floor_binary(env):
    """`examples/relay_floor.rs`, built beside the gateway binary."""
    return os.path.join(os.path.dirname(env.binary), "examples", "relay_floor")


def _floor(env, sock, n, sc, ir):
    """The bare tokio relay (`examples/relay_floor.rs`: the gateway's runtime, bytes copied
    both ways, nothing else) in front of the same server, counted like PgBouncer: syscalls
    by strace on the running process, instructions over whole processes under callgrind.
    Fills `sc`/`ir` under "floor"; returns a note when it could not run."""
    src = floor_binary(env)
    if not os.path.exists(src):
        return f"not measured ({src} missing: cargo build --release --example relay_floor)"
    # Copied where the `sandpit` user can run it (peer auth to the server maps that user).
    binary = os.path.join(env.dir, "relay_floor")
    shutil.copy(src, binary)
    os.chmod(binary, 0o755)
    port = _sections().free_port()
    dsn = f"host=127.0.0.1 port={port} user=agent dbname=sandpit sslmode=disable"
    fdir = os.path.join(env.dir, "relay-floor")  # callgrind writes as the `sandpit` user
    os.makedirs(fdir, exist_ok=True)
    subprocess.run(["chown", "sandpit", fdir], check=True)
    out = os.path.join(fdir, "callgrind.out")

    def start(valgrind):
        argv = [*(_valgrind_argv(out, whole=True) if valgrind else []), binary, str(port),
                os.path.join(sock, ".s.PGSQL.5432")]
        p = subprocess.Popen(env.server_cmd(["runuser", "-u", "sandpit", "--", *argv]),
                             stdout=subprocess.PIPE, stderr=open(os.path.join(fdir, "stderr"), "a"),
                             text=True)
        env.procs.append(p)
        line = p.stdout.readline().split()
        if len(line) != 2 or line[0] != "ready":
            raise RuntimeError("relay_floor did not start: " + open(os.path.join(fdir, "stderr")).read()[-300:])
        return p, int(line[1])

    def stop(p, pid):
        os.kill(pid, signal.SIGTERM)
        p.wait(120)

    p, pid = start(False)
    for mode in MODES:
        sc[("floor", mode)] = _per_tx(lambda e, d, m, k: _strace_total(pid, e, d, m, k), env, dsn, mode, n)
    stop(p, pid)

    def whole(k, mode):
        if os.path.exists(out):
            os.unlink(out)
        p, pid = start(True)
        _pgbench(env, dsn, mode, 50)
        _pgbench(env, dsn, mode, k)
        stop(p, pid)
        total = _totals(out)
        if total is None:
            raise RuntimeError("relay_floor's callgrind file is missing")
        return total
    for mode in MODES:
        ir[("floor", mode)] = (whole(n, mode) - whole(1, mode)) / (n - 1)
    return None


def relay(env, sz):
    """The relay cost section (bench/run's `relay`, and bench/relay-cost)."""
    if not env.root:
        raise bl.Skip("not root: PgBouncer needs the scratch server's socket")
    for tool in ["valgrind", "callgrind_control", "strace", "pgbouncer"]:
        if not shutil.which(tool):
            raise bl.Skip(f"{tool} not installed")
    sec = _sections()
    n = sz.get("relay_tx", 2000)
    native = env
    cg_out = os.path.join(env.dir, "gateway.callgrind")
    under_cg = copy.copy(env)
    under_cg.binary = _wrapper(env, env.binary, cg_out)
    # No end-of-token review: its reference server would be copied in the background right
    # after the fork, inside the gateway process, and counted with the transactions.
    base = "[pool]\nsize = 0\n[review]\non_end = false\n"
    on, off = base, base + "[log]\nstatements = false\n"

    sql = bl.golden_sql(os.path.join(env.dir, "relay.sql"), rows=1000)
    g = bl.Gateway(native, "relay", os.path.join(env.dir, "relay"), sql, on)
    t = g.issue("relay-cost")
    bl.first_query(t["dsn_plain"])
    subprocess.run(env.client_cmd([sec.pgbin("pgbench"), "-i", "-q", "-s", "1", t["dsn_plain"]]),
                   check=True, capture_output=True)
    pm, sock = g.postmaster(t["id"])
    with open(os.path.join(g.instance_dir(t["id"]), "pg_ident.conf"), "a") as f:
        f.write("sandpit sandpit agent\n")
    os.kill(pm, signal.SIGHUP)  # reload pg_ident
    time.sleep(0.3)

    ir, sc = {}, {}  # (target, mode) -> per transaction
    def gw_pid():
        return g.proc.pid  # taskset and the wrapper exec: the gateway (or valgrind) itself

    # PgBouncer first, while the scratch server is up (the gateway runs it).
    port = sec.free_port()
    bdsn = f"host=127.0.0.1 port={port} user=bench password=bench-secret dbname=bench sslmode=disable"
    bdir = os.path.join(env.dir, "pgbouncer")
    p = sec.pgbouncer(env, sock, port)
    bpid = _bouncer_pid(bdir)
    for mode in MODES:
        sc[("pgbouncer", mode)] = _per_tx(lambda e, d, m, k: _strace_total(bpid, e, d, m, k), env, bdsn, mode, n)
    for mode in MODES:
        sc[("on", mode)] = _per_tx(lambda e, d, m, k: _strace_total(gw_pid(), e, d, m, k),
                                   env, t["dsn_plain"], mode, n)
    _stop_bouncer(p, bdir)
    # PgBouncer under callgrind: valgrind's gdbserver (which callgrind_control needs) cannot
    # reach a process of another user here (and crashed it when forced), so each count is
    # a whole process, started, run and stopped; the difference of a run of N and a run of
    # 1 transaction leaves the transactions alone (start, warm-up and exit cancel out).
    bcg = os.path.join(bdir, "pgbouncer.callgrind")
    bouncer_cg = copy.copy(env)
    bouncer_cg.server_cmd = lambda argv: env.server_cmd(
        sum(([*_valgrind_argv(bcg, whole=True), "pgbouncer"] if a == "pgbouncer" else [a]
             for a in argv), []))

    def bouncer_ir(e, d, m, k):
        if os.path.exists(bcg):
            os.unlink(bcg)
        p = sec.pgbouncer(bouncer_cg, sock, port)
        _pgbench(env, bdsn, m, 50)
        _pgbench(env, bdsn, m, k)
        pid_file = os.path.join(bdir, "pgbouncer.pid")
        os.kill(_bouncer_pid(bdir), signal.SIGTERM)
        p.wait(120)
        if os.path.exists(pid_file):
            os.unlink(pid_file)
        total = _totals(bcg)
        if total is None:
            raise RuntimeError("PgBouncer's callgrind file is missing")
        return total
    for mode in MODES:
        ir[("pgbouncer", mode)] = (bouncer_ir(env, bdsn, mode, n) - bouncer_ir(env, bdsn, mode, 1)) / (n - 1)
    floor = _floor(env, sock, n, sc, ir)

    for label, cfg, e in [("off", off, native), ("on", on, under_cg), ("off", off, under_cg)]:
        g.env = e
        g.restart(cfg)
        # The token survives a restart; the gateway listens on a new port.
        port_now = g.pg.rsplit(":", 1)[1].strip("/")
        t["dsn_plain"] = re.sub(r"@([^@/]+):\d+/", lambda m: f"@{m.group(1)}:{port_now}/", t["dsn_plain"])
        bl.first_query(t["dsn_plain"])
        for mode in MODES:
            if e is native:
                sc[(label, mode)] = _per_tx(lambda e_, d, m, k: _strace_total(gw_pid(), e_, d, m, k),
                                            env, t["dsn_plain"], mode, n)
            else:
                ir[(label, mode)] = _per_tx(lambda e_, d, m, k: _callgrind_total(gw_pid(), cg_out, e_, d, m, k),
                                            env, t["dsn_plain"], mode, n)
    g.env = native
    g.stop()

    rows, table = [], [
        f"Relay cost per `pgbench -S -c 1` transaction ({n} transactions, the connection's own "
        "cost taken out), proxy process only:", "",
        "| mode | Ir/tx sandpit log on | log off | bare tokio relay | PgBouncer | log on ÷ PgBouncer (≤ 2.5) "
        "| bare tokio ÷ PgBouncer | syscalls/tx sandpit log on | log off | bare tokio relay | PgBouncer "
        "| log on − PgBouncer (≤ 1) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    def fig(v, f):
        return "n/a" if v is None else format(v, f)
    for mode in MODES:
        i_on, i_off, i_b = ir[("on", mode)], ir[("off", mode)], ir[("pgbouncer", mode)]
        s_on, s_off, s_b = sc[("on", mode)], sc[("off", mode)], sc[("pgbouncer", mode)]
        i_f, s_f = ir.get(("floor", mode)), sc.get(("floor", mode))
        ratio, extra = i_on / i_b, s_on - s_b
        table.append(f"| {mode} | {i_on:,.0f} | {i_off:,.0f} | {fig(i_f, ',.0f')} | {i_b:,.0f} | {ratio:.2f} "
                     f"| {fig(None if i_f is None else i_f / i_b, '.2f')} "
                     f"| {s_on:.2f} | {s_off:.2f} | {fig(s_f, '.2f')} | {s_b:.2f} | {extra:+.2f} |")
        rows.append(Row(f"relay cost, pgbench -S -M {mode} -c 1: gateway Ir/tx sandpit log on / off / PgBouncer",
                        f"{i_on:,.0f} / {i_off:,.0f} / {i_b:,.0f} ({ratio:.2f} ×)",
                        f"≤ {TARGET_IR} × PgBouncer", _sections().verdict(ratio <= TARGET_IR)))
        rows.append(Row(f"… syscalls/tx sandpit log on / off / PgBouncer ({mode})",
                        f"{s_on:.2f} / {s_off:.2f} / {s_b:.2f} ({extra:+.2f})",
                        "≤ PgBouncer + 1", _sections().verdict(extra <= TARGET_SYSCALLS)))
        log(f"relay {mode}: Ir/tx {i_on:.0f} / {i_off:.0f} / {i_b:.0f}, syscalls/tx {s_on:.2f} / {s_off:.2f} / {s_b:.2f}")
    if floor:
        table.append(f"\nBare tokio relay: {floor}")
    env.tables.append("\n".join(table) + "\n")
    return rows
