"""The benchmark sections. Each returns report rows; figures are printed, not asserted."""
import os
import subprocess
import threading
import time

import psycopg

import benchlib as bl
from benchlib import Row, log, med_p99, pct
from providers import providers  # noqa: F401  (a section, looked up by name)
from shared_gateway import MAIN, is_shared, shared
from stall import stall  # noqa: F401  (a section, looked up by name)

# The pgbench runs keep the statement log on but lift its per-token quota (256 MiB by
# default, ~700 k pgbench transactions): 9 × 30 s at full speed write more than that, and a
# full log refuses statements by design.
PGBENCH = MAIN + "[log]\nmax_bytes_per_token = 0\n"


def _cold_runs(g, runs, label):
    times = []
    for i in range(runs):
        t = g.issue(f"cold-{label}-{i}")
        times.append(bl.first_query(t["dsn_plain"]))
        g.revoke(t["id"])
    return times


# Server-side phases of a first connection, in the order they happen.
PHASES = ["auth", "claim", "claim_lock", "claim_provider", "claim_record", "backend_connect", "greet"]


def warm(env, sz):
    """First query of a new token when a warm pool fork is ready, and where its time goes:
    the client's connect and query, and the gateway's phase medians from /metrics; then the
    same with another process writing and syncing to the gateway's file system."""
    env.pin_self_to_clients()
    g = shared(env, "[pool]\nsize = 2\n")
    quiet = _warm_runs(g, sz["runs"], "warm")
    phases = g.summary_medians("sandpit_first_query_phase_seconds", "phase")
    split = ", ".join(f"{p} {phases[p]:.1f}" for p in PHASES if p in phases)
    with DiskWriter(g.data_dir):
        busy = _warm_runs(g, sz["runs"], "warm-disk")
    times, connects, queries = quiet
    return [Row("first query of a new token, warm pool (connect + SCRAM + `select 1`)",
                med_p99(times), "≤ 10 ms median (quiet)", verdict(pct(times, 50) <= 10)),
            Row("… client side, medians: connect / `select 1`",
                f"{pct(connects, 50):.1f} / {pct(queries, 50):.1f} ms", "printed", ""),
            Row("… gateway side, phase medians (ms)", split or "no phase metrics", "printed", ""),
            Row("same, while another process writes 1 MiB and `fdatasync`s in a loop on the "
                "data dir's file system", med_p99(busy[0]), "≤ 15 ms median",
                verdict(pct(busy[0], 50) <= 15))]


def _warm_runs(g, runs, label):
    times, connects, queries = [], [], []
    for i in range(runs):
        deadline = time.time() + 120
        while (g.metric("sandpit_pool_ready") or 0) < 2 and time.time() < deadline:
            time.sleep(0.05)
        t = g.issue(f"{label}-{i}")
        total, conn, query = bl.first_query_split(t["dsn_plain"])
        times.append(total)
        connects.append(conn)
        queries.append(query)
        g.revoke(t["id"])
    return times, connects, queries


DISK_WRITER = """
import os, sys
path = sys.argv[1]
block = os.urandom(1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
n = 0
while True:
    if n % 64 == 0:
        os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, block)
    os.fdatasync(fd)
    n += 1
"""


class DiskWriter:
    """Another process writing 1 MiB and `fdatasync`ing, in a loop over a 64 MiB file on the
    given directory's file system, for the length of the block."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "bench-disk-writer.tmp")

    def __enter__(self):
        self.proc = subprocess.Popen(["python3", "-c", DISK_WRITER, self.path])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
        try:
            log(f"disk writer: {os.path.getsize(self.path) >> 20} MiB file")
            os.unlink(self.path)
        except OSError:
            pass


def cold(env, sz):
    """Cold fork: small and big golden on a loop-mounted XFS (reflink), big on a plain copy."""
    env.pin_self_to_clients()
    rows = []
    big_sql = bl.golden_sql(os.path.join(env.dir, "big.sql"), mb=sz["big_mb"])
    small_sql = bl.golden_sql(os.path.join(env.dir, "small.sql"), rows=sz["small_rows"])
    try:
        xdir = env.xfs_dir(8 if sz["big_mb"] >= 1024 else 4)
    except bl.Skip as e:
        rows.append(Row("first query of a new token, cold fork, XFS reflink", "not run",
                        "≤ 100 ms median; big ÷ small ≤ 1.3", f"skipped: {e}"))
        xdir = None
    if xdir:
        gs = bl.Gateway(env, "xfs-small", os.path.join(xdir, "small"), small_sql, "[pool]\nsize = 0\n")
        small = _cold_runs(gs, sz["runs"], "xs")
        small_mb, method_s = gs.golden_size_mb(), gs.copy_method()
        gs.stop()
        t0 = time.time()
        gb = bl.Gateway(env, "xfs-big", os.path.join(xdir, "big"), big_sql, "[pool]\nsize = 0\n")
        log(f"big golden built in {time.time() - t0:.0f} s")
        big = _cold_runs(gb, sz["runs"], "xb")
        big_mb, method_b = gb.golden_size_mb(), gb.copy_method()
        gb.stop()
        ratio = pct(big, 50) / pct(small, 50)
        rows.append(Row(f"first query of a new token, cold fork, golden {big_mb} MB, XFS ({method_b})",
                        med_p99(big), "≤ 100 ms median", verdict(pct(big, 50) <= 100)))
        rows.append(Row(f"same, golden {small_mb} MB, XFS ({method_s})", med_p99(small), "", ""))
        rows.append(Row(f"{big_mb} MB ÷ {small_mb} MB (medians)", f"{ratio:.2f}", "≤ 1.3",
                        verdict(ratio <= 1.3)))
    gp = bl.Gateway(env, "copy-big", os.path.join(env.dir, "copy-big"), big_sql, "[pool]\nsize = 0\n")
    fs = bl.fs_type(gp.data_dir)
    plain = _cold_runs(gp, sz["copy_runs"], "pb")
    big_mb, method = gp.golden_size_mb(), gp.copy_method()
    gp.stop()
    g = shared(env, MAIN)
    small_plain = _cold_runs(g, sz["runs"], "ps")
    rows.append(Row(f"same, golden {big_mb} MB, {fs} ({method})", med_p99(plain), "printed", ""))
    rows.append(Row(f"same, golden {g.golden_size_mb()} MB, {fs} ({g.copy_method()})",
                    med_p99(small_plain), "printed", ""))
    return rows


def verdict(ok):
    return "met" if ok else "**missed**"


def _scratch_with_pgbench(env, sz, clients, config):
    g = shared(env, config)
    t = g.issue("pgbench", max_connections=clients + 8)
    bl.first_query(t["dsn_plain"])
    subprocess.run(env.client_cmd([pgbin("pgbench"), "-i", "-q", "-s", str(sz["pg_scale"]), t["dsn_plain"]]),
                   check=True, capture_output=True)
    return g, t


def pgbin(name):
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
    for d in ([out.stdout.strip()] if out.returncode == 0 else []) + sorted(
            [f"/usr/lib/postgresql/{v}/bin" for v in os.listdir("/usr/lib/postgresql")], reverse=True):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return name


def pgbouncer(env, sock, port):
    """PgBouncer (Debian's) as the `sandpit` user, session mode, SCRAM to clients, peer auth
    to the scratch server through an extra pg_ident line (sandpit -> agent)."""
    d = os.path.join(env.dir, "pgbouncer")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "userlist.txt"), "w") as f:
        f.write('"bench" "bench-secret"\n')
    with open(os.path.join(d, "pgbouncer.ini"), "w") as f:
        f.write(f"""[databases]
bench = host={sock} port=5432 user=agent dbname=sandpit
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {d}/userlist.txt
pool_mode = session
max_client_conn = 200
default_pool_size = 64
logfile = {d}/pgbouncer.log
pidfile = {d}/pgbouncer.pid
""")
    subprocess.run(["chown", "-R", "sandpit", d], check=True)
    p = subprocess.Popen(env.server_cmd(["runuser", "-u", "sandpit", "--", "pgbouncer", f"{d}/pgbouncer.ini"]),
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "stderr"), "w"))
    env.procs.append(p)
    for _ in range(200):
        try:
            psycopg.connect(f"host=127.0.0.1 port={port} user=bench password=bench-secret dbname=bench "
                            "sslmode=disable").close()
            return p
        except psycopg.OperationalError:
            time.sleep(0.05)
    raise RuntimeError("pgbouncer did not come up: " + open(os.path.join(d, "stderr")).read()[-300:])


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_pgbench(env, dsn, mode, clients, secs):
    """tps and per-transaction latency (median, p99 over a 10% sample) of one run."""
    prefix = os.path.join(env.dir, f"pgb-{time.time_ns()}")
    r = subprocess.run(env.client_cmd([pgbin("pgbench"), "-n", "-S", "-M", mode, "-c", str(clients), "-j", "2",
                                       "-T", str(secs), "-l", "--sampling-rate", "0.1", "--log-prefix", prefix, dsn]),
                       capture_output=True, text=True)
    tps = None
    for ln in r.stdout.splitlines():
        if ln.startswith("tps = "):
            tps = float(ln.split()[2])
        if ln.startswith("number of failed transactions:") and not ln.split(":")[1].strip().startswith("0"):
            raise RuntimeError(f"pgbench failures: {ln}")
    if r.returncode != 0 or tps is None:
        raise RuntimeError(f"pgbench failed: {r.stderr[-300:]}")
    lat = []
    d = os.path.dirname(prefix)
    for name in os.listdir(d):
        if name.startswith(os.path.basename(prefix)):
            with open(os.path.join(d, name)) as f:
                lat += [int(ln.split()[2]) / 1000 for ln in f if ln.strip()]
            os.unlink(os.path.join(d, name))
    return tps, lat


def pgbench(env, sz):
    """pgbench -S through sandpit (log on) vs PgBouncer vs direct, same scratch server."""
    if not env.root:
        raise bl.Skip("not root: the direct and PgBouncer paths need the scratch socket")
    clients, secs = 16, sz["pg_secs"]
    g, t = _scratch_with_pgbench(env, sz, clients, PGBENCH)
    pid, sock = g.postmaster(t["id"])
    with open(os.path.join(g.instance_dir(t["id"]), "pg_ident.conf"), "a") as f:
        f.write("sandpit sandpit agent\n")
    os.kill(pid, 1)  # SIGHUP: reload pg_ident
    time.sleep(0.3)
    port = free_port()
    bouncer = pgbouncer(env, sock, port)
    targets = {
        "direct": f"host={sock} port=5432 user=agent dbname=sandpit",
        "pgbouncer": f"host=127.0.0.1 port={port} user=bench password=bench-secret dbname=bench sslmode=disable",
        "sandpit": t["dsn_plain"],
    }
    rows = []
    for mode in ["simple", "extended", "prepared"]:
        res = {}
        for name, dsn in targets.items():  # interleaved, same server, same data
            res[name] = run_pgbench(env, dsn, mode, clients, secs)
            log(f"pgbench {mode} {name}: {res[name][0]:.0f} tps")
        s, b, d = res["sandpit"][0], res["pgbouncer"][0], res["direct"][0]
        first = mode == "simple"
        rows.append(Row(f"pgbench -S -M {mode}, {clients} clients, {secs} s: tps sandpit (log on) / PgBouncer / direct",
                        f"{s:.0f} / {b:.0f} / {d:.0f}", "", ""))
        rows.append(Row(f"… latency median / p99, ms: sandpit · PgBouncer · direct",
                        " · ".join(f"{pct(res[n][1], 50):.2f} / {pct(res[n][1], 99):.2f}"
                                   for n in ["sandpit", "pgbouncer", "direct"]), "", ""))
        rows.append(Row(f"… sandpit ÷ PgBouncer ({mode})", f"{s / b:.2f}", "≥ 1.0" if first else "printed",
                        verdict(s / b >= 1.0) if first else ""))
        rows.append(Row(f"… sandpit ÷ direct ({mode})", f"{s / d:.2f}", "≥ 0.85" if first else "printed",
                        verdict(s / d >= 0.85) if first else ""))
    # What TLS costs (bench/pgbench.sh measured this before).
    tls = run_pgbench(env, t["dsn"] + "?sslmode=require", "simple", clients, secs)[0]
    s = float(rows[0].measured.split(" / ")[0])
    rows.append(Row("pgbench -S -M simple through sandpit over TLS (sslmode=require): tps, ÷ without TLS",
                    f"{tls:.0f}, {tls / s:.2f}", "printed", ""))
    bouncer.terminate()
    bouncer.wait(10)
    g.revoke(t["id"])
    return rows


def caps(env, sz):
    """Capped SELECT * over N rows through sandpit vs LIMIT 200 straight to the scratch server."""
    if not env.root:
        raise bl.Skip("not root: the direct path needs the scratch socket")
    g = shared(env, MAIN)
    t = g.issue("caps")
    n = sz["cap_rows"]
    psql = pgbin("psql")
    subprocess.run([psql, t["dsn_plain"], "-Xq", "-c",
                    f"create table ten as select g as id, md5(g::text) as v from generate_series(1, {n}) g",
                    "-c", "vacuum analyze ten"], check=True, capture_output=True)
    _, sock = g.postmaster(t["id"])
    direct = f"host={sock} port=5432 user=agent dbname=sandpit"
    via, lim = [], []
    for _ in range(sz["cap_runs"]):
        for dsn, q, acc in [(t["dsn_plain"], "select * from ten", via), (direct, "select * from ten limit 200", lim)]:
            t0 = time.perf_counter()
            subprocess.run(env.client_cmd([psql, dsn, "-XAtq", "-c", q]), check=True, capture_output=True)
            acc.append((time.perf_counter() - t0) * 1000)
    # The end reviews a 10 M-row new table (its rows hashed for the patch check): minutes,
    # not the default minute, or the next section measures this review's memory and CPU.
    g.revoke(t["id"], timeout=900)
    ratio = pct(via, 50) / pct(lim, 50)
    return [Row(f"capped `select *` over {n:,} rows through sandpit (psql wall time)", med_p99(via), "", ""),
            Row("`select * … limit 200` direct to the scratch server", med_p99(lim), "", ""),
            Row("capped ÷ LIMIT 200 direct (medians)", f"{ratio:.2f}", "≤ 2.0", verdict(ratio <= 2.0))]


def rss(env, sz):
    """Gateway RSS per idle relayed session: N sessions over T tokens (issue 36: 1,000 over
    50), each having run `select 1`. The baseline, measured in the same run on the same
    gateway, is its RSS with each token's first session open (forks, logs, runtimes)."""
    n, k = sz["idle"], sz["idle_tokens"]
    per_token = -(-n // k)
    env.pin_self_to_clients()
    g = shared(env, f"[pool]\nsize = 0\n[postgres]\nmax_connections = {per_token + 10}\n")
    tokens = [g.issue(f"rss-{i}", max_connections=per_token + 2) for i in range(k)]
    conns = []
    try:
        for t in tokens:
            c = psycopg.connect(t["dsn_plain"], autocommit=True)
            c.execute("select 1")
            conns.append(c)
        time.sleep(1)
        before = g.rss_kib()
        for i in range(n):
            c = psycopg.connect(tokens[i % k]["dsn_plain"], autocommit=True)
            c.execute("select 1")
            conns.append(c)
        time.sleep(1)
        after = g.rss_kib()
    finally:
        for c in conns:
            c.close()
        for t in tokens:
            g.revoke(t["id"])
    per = (after - before) / n
    label = f"gateway RSS per idle relayed session ({n:,} sessions over {k} tokens, SCRAM, no TLS)"
    value = f"{per:.1f} KiB ({before / 1024:.0f} → {after / 1024:.0f} MiB)"
    if per < 4:
        # A session holds at least its two sockets' buffers and its task: less than that
        # means the sessions reused memory something else had freed (work still running in
        # the gateway at `before`), not that they cost nothing.
        return [Row(label, value, "≤ 24 KiB", "**not measured**: the gateway's RSS did not grow with its sessions")]
    return [Row(label, value, "≤ 24 KiB", verdict(per <= 24))]


def _burst_once(g, n, label, after=None):
    """N tokens issued, then N threads released by one barrier each run a first query;
    `after()` runs once they are done, before the revokes. Returns (times of those that
    succeeded, errors)."""
    toks = [g.issue(f"{label}-{i}") for i in range(n)]
    res = [None] * n
    gate = threading.Barrier(n)

    def one(i):
        gate.wait()
        try:
            res[i] = bl.first_query(toks[i]["dsn_plain"])
        except Exception as e:  # counted as a failure in the table
            res[i] = e
    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    if after:
        after()
    for tk in toks:
        g.revoke(tk["id"])
    ok = [r for r in res if isinstance(r, float)]
    errs = [r for r in res if not isinstance(r, float)]
    if errs:
        log(f"{label} errors: {errs[:3]}")
    return ok, errs


def _burst_row(what, n, ok, errs, extra=""):
    p99 = pct(ok, 99) if ok else float("inf")
    return Row(what, f"{len(ok)}/{n} ok; " + (med_p99(ok) if ok else "-") + extra,
               "all succeed; p99 ≤ 3 s", verdict(not errs and p99 <= 3000))


def pool_idle_mib(g):
    """Memory of the scratch servers running now (the pool's idle members when no token has
    a backend): the sum of their processes' PSS (shared memory split among its users)."""
    kib = 0
    root = os.path.join(g.data_dir, "pg", "instances")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if root not in open(f"/proc/{pid}/cmdline").read().replace("\0", " ") and \
                    root not in os.readlink(f"/proc/{pid}/cwd"):
                continue
            for ln in open(f"/proc/{pid}/smaps_rollup"):
                if ln.startswith("Pss:"):
                    kib += int(ln.split()[1])
        except OSError:
            continue
    return kib / 1024


def burst(env, sz):
    """N tokens connecting for the first time at the same moment: N cold forks (pool off);
    then with a demand-growing pool (`size` 2, `max_size` N): the first burst finds 2 members,
    the next finds the pool grown by the first. Pool size and idle memory printed beside."""
    n = sz["burst"]
    env.pin_self_to_clients()
    try:  # forks are reflinks where the deployment would put them; else plain copies
        xdir = env.xfs_dir(8 if sz["big_mb"] >= 1024 else 4)
        sql = bl.golden_sql(os.path.join(env.dir, "small.sql"), rows=sz["small_rows"])
        g = bl.Gateway(env, "xfs-burst", os.path.join(xdir, "small"), sql, MAIN)
    except bl.Skip:
        g = shared(env, MAIN)
    method, fs = g.copy_method(), bl.fs_type(g.data_dir)
    ok, errs = _burst_once(g, n, "burst")
    rows = [_burst_row(f"{n} tokens first-connecting at once (each a cold fork, {fs}, {method})",
                       n, ok, errs)]
    pool = f'[pool]\nsize = 2\nmax_size = {n}\ndemand_half_life = "10m"\n'
    g.restart(MAIN.replace("[pool]\nsize = 0\n", pool))

    def wait_pool(want, limit):
        deadline = time.time() + limit
        while (g.metric("sandpit_pool_ready") or 0) < want and time.time() < deadline:
            time.sleep(0.5)
        return int(g.metric("sandpit_pool_ready") or 0)
    ready = wait_pool(2, 120)
    mem = pool_idle_mib(g)
    ok, errs = _burst_once(g, n, "burst-pool1")
    rows.append(_burst_row(f"… same, demand-growing pool (size 2, max_size {n}), first burst",
                           n, ok, errs, f"; pool before: {ready} ready, {mem:.0f} MiB idle"))
    t0 = time.time()
    ready = wait_pool(n, 900)
    grown_s = time.time() - t0
    mem = pool_idle_mib(g)
    ok, errs = _burst_once(g, n, "burst-pool2")
    rows.append(_burst_row("… same pool, next burst (pool grown by the first)", n, ok, errs,
                           f"; pool before: {ready} ready ({grown_s:.0f} s to grow), {mem:.0f} MiB idle"))
    if not is_shared(g):
        g.stop()
    else:
        g.restart(MAIN)
    try:  # its own gateway and server: a failure there must not hide the rows above
        rows += burst_template(env, sz)
    except Exception as e:
        log(f"burst-template failed: {e!r}")
        rows.append(Row("burst, `template` provider", "error", "", f"{type(e).__name__}: {e}"))
    return rows


def tree_pss(root_pid):
    """(MiB of PSS, number of processes) of the processes descending from `root_pid`, not
    counting it: a `bench_backends postgres` is a launcher, its postmaster tree the server."""
    children = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    kib, n, todo = 0, 0, list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for ln in open(f"/proc/{pid}/smaps_rollup"):
                if ln.startswith("Pss:"):
                    kib += int(ln.split()[1])
            n += 1
        except OSError:
            continue
    return kib / 1024, n


def burst_template_pool(env, sz):
    """Only the standing-pool row of `burst_template` (its pool-off burst skipped)."""
    return burst_template(env, sz, cold=False)


def burst_template(env, sz, cold=True):
    """The same burst on the `template` provider: one shared Postgres server (started by
    `bench_backends`, pinned with the servers), a fork is `CREATE DATABASE … TEMPLATE` plus
    a login role; pool off, so every one of the N first connections forks. The standing
    cost beside it is that server's PSS and process count while idle, before the burst."""
    from providers import Backends, backends_binary, template_golden_mb
    n = sz["burst"]
    env.pin_self_to_clients()
    if not os.path.exists(backends_binary(env)):
        raise bl.Skip(f"{backends_binary(env)} missing (cargo build --release --example bench_backends)")
    tmp = os.path.join(env.dir, "burst-tpl-srv")
    os.makedirs(tmp)
    os.chmod(tmp, 0o755)
    # Room for N task sessions, the forks' admin sessions and the gateway's own.
    max_conn = 2 * n + 20
    srv = Backends(env, "burst-tpl-srv", ["postgres", str(max_conn)], tmp)
    try:
        sql = bl.golden_sql(os.path.join(env.dir, "burst-tpl.sql"), rows=sz["small_rows"], vacuum=False)
        cfg = (f'provider = "template"\n[template]\nadmin_dsn = "{srv.info["admin_dsn"]}"\n'
               'golden = "golden_burst"\nsslmode = "require"\n'
               # Revokes after the burst are not timed; their reviews would only add minutes.
               "[review]\non_end = false\n")
        g = bl.Gateway(env, "burst-tpl", os.path.join(env.dir, "burst-tpl-gw"), sql, cfg + MAIN)
        try:
            time.sleep(2)  # the golden build's sessions gone, the server idle
            rows = []
            if cold:
                mem, procs = tree_pss(srv.proc.pid)
                ok, errs = _burst_once(g, n, "burst-tpl")
                log(f"burst-template: pool off, {len(ok)}/{n} ok, p99 {pct(ok, 99) if ok else 0:.0f} ms")
                db_mb = template_golden_mb(srv.info["admin_dsn"], "golden_burst")
                rows.append(_burst_row(f"{n} tokens first-connecting at once, `template` provider, pool off (each a "
                                       f"`CREATE DATABASE … TEMPLATE` of a {db_mb} MB golden + a login role)", n,
                                       ok, errs, f"; shared server before: {mem:.0f} MiB PSS idle, {procs} "
                                       f"processes, max_connections {max_conn}"))
            # A standing pool of N: members are databases on the shared server, no processes.
            g.restart(cfg + MAIN.replace("[pool]\nsize = 0\n", f"[pool]\nsize = {n}\n"))
            t0 = time.time()
            while (g.metric("sandpit_pool_ready") or 0) < n and time.time() - t0 < 1200:
                time.sleep(0.5)
            ready, fill_s = int(g.metric("sandpit_pool_ready") or 0), time.time() - t0
            log(f"burst-template: pool of {ready} ready in {fill_s:.0f} s")
            time.sleep(2)
            mem, procs = tree_pss(srv.proc.pid)
            disk = pool_disk_mb(srv.info["admin_dsn"])
            ok, errs = _burst_once(g, n, "burst-tpl-pool", after=lambda: log_phases(g, "burst-template, pool"))
            rows.append(_burst_row(f"… same, `template` with a standing pool of {n} (`size = {n}`)", n, ok, errs,
                                   f"; pool before: {ready} ready ({fill_s:.0f} s to fill), shared server "
                                   f"{mem:.0f} MiB PSS idle, {procs} processes; members on disk {disk} MB"))
        finally:
            # Not a clean stop: it would drop the refilled pool's databases one by one
            # (minutes), and the server with every database goes next anyway.
            g.proc.kill()
            g.proc.wait()
    finally:
        srv.stop()
    return rows


def log_phases(g, label):
    """Where the gateway's side of the burst's first connections went: median / p99 / max
    of each `sandpit_first_query_phase_seconds` phase (the summary's window is the last
    minute, so read right after the burst)."""
    q = {k: g.summary_medians("sandpit_first_query_phase_seconds", "phase", k) for k in ("0.5", "0.99", "1")}
    log(f"{label}: phases median / p99 / max ms: " + ", ".join(
        f"{p} {q['0.5'][p]:.0f} / {q['0.99'].get(p, 0):.0f} / {q['1'].get(p, 0):.0f}" for p in q["0.5"]))


def pool_disk_mb(admin_dsn):
    """Disk held by the template provider's warm-pool member databases (`pool-…`), MB."""
    with psycopg.connect(admin_dsn, sslmode="require", autocommit=True) as c:
        return round(c.execute("select coalesce(sum(pg_database_size(datname)), 0)::bigint from pg_database "
                               "where datname like 'pool-%'").fetchone()[0] / 1e6)


def expiry(env, sz):
    """From TTL expiry to the scratch postmaster gone from the process table."""
    g = shared(env, MAIN)
    lags, dirs = [], []
    for i in range(sz["expiry_runs"]):
        t = g.issue(f"expiry-{i}", ttl=3)
        due = time.time() + 3  # the token was issued before this: the real lag is smaller
        c = psycopg.connect(t["dsn_plain"], autocommit=True)
        c.execute("select 1")
        pid, _ = g.postmaster(t["id"])
        inst = os.path.dirname(g.instance_dir(t["id"]))
        gone = dgone = None
        while time.time() < due + 30 and (gone is None or dgone is None):
            now = time.time()
            if gone is None and not alive(pid):
                gone = now
            if dgone is None and not os.path.exists(inst):
                dgone = now
            time.sleep(0.002)
        c.close()
        lags.append(((gone or now) - due) * 1000)
        dirs.append(((dgone or now) - due) * 1000)
    return [Row("backend gone after expiry (postmaster out of the process table)", med_p99(lags, fmt="{:.0f}"),
                "≤ 1 s", verdict(pct(lags, 50) <= 1000)),
            Row("… and its data directory removed", med_p99(dirs, fmt="{:.0f}"), "", "")]


def alive(pid):
    """A zombie (exited, not yet reaped) counts as gone: it holds no memory or socket."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
