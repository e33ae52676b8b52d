"""The `providers` section: first query of a new token, cold fork vs a warm pool of 2, for
each provider (`instance`, `template`, `remote`) × golden size × copy method available.

Backends for `template` and `remote` come from `examples/bench_backends.rs`: the Postgres
server and the sandbox service the tests start (`tests/support/`), run as a process.
Figures are printed, not asserted.
"""
import json
import os
import shutil
import signal
import subprocess
import time

import psycopg

import benchlib as bl
from benchlib import Row, log, pct

# Appended after the bench config of every gateway here: reviews diff the scratch database
# against the golden when a token ends, which is slow on a 1 GB golden and not measured here.
COMMON = "[review]\non_end = false\n"


def plan(quick):
    """Golden sizes (MiB of table data) and runs per figure."""
    if quick:
        return dict(sizes=[20], warm=5, cold=3, cold_big=3)
    return dict(sizes=[20, 200, 1024], warm=20, cold=10, cold_big=7)


def backends_binary(env):
    return os.path.join(os.path.dirname(env.binary), "examples", "bench_backends")


class Backends:
    """A `bench_backends` process (a Postgres server or the sandbox service), pinned to the
    server core; its scratch files go under `tmpdir`."""

    def __init__(self, env, name, args, tmpdir):
        self.out = os.path.join(env.dir, f"{name}.out")
        self.err = os.path.join(env.dir, f"{name}.log")
        self.proc = subprocess.Popen(env.server_cmd([backends_binary(env)] + args),
                                     stdout=open(self.out, "w"), stderr=open(self.err, "w"),
                                     env=dict(os.environ, TMPDIR=tmpdir))
        env.procs.append(self.proc)
        t0 = time.time()
        while True:
            text = open(self.out).read()
            if text.endswith("\n"):
                self.info = json.loads(text.splitlines()[0])
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"bench_backends {name} exited: {open(self.err).read()[-500:]}")
            if time.time() - t0 > 900:
                raise RuntimeError(f"bench_backends {name} not ready in 900 s")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cold_runs(g, n, label):
    """Pool off: each first query waits for the token's fork. Revoke returns once the
    backend is destroyed, so runs do not overlap (the instance provider deletes the copied
    directory in the background, as it does in production)."""
    times = []
    for i in range(n):
        t = g.issue(f"{label}-cold-{i}")
        times.append(bl.first_query(t["dsn_plain"]))
        g.revoke(t["id"])
    return times


def pool_failure(g):
    """The last "warm pool fork failed" error in the gateway log, if any."""
    last = None
    for ln in open(g.log_path):
        if "warm pool fork failed" in ln:
            last = ln.split("error=", 1)[-1].strip()
    return last


def warm_runs(g, n, label, size=2):
    """Pool of `size`: each run waits until the pool is full again, so it measures a claim."""
    times = []
    for i in range(n):
        deadline = time.time() + 900
        while (g.metric("sandpit_pool_ready") or 0) < size:
            failed = pool_failure(g)
            if failed:  # the pool retries every 5 s forever; the bench stops here
                raise RuntimeError(f"the warm pool cannot fill: {failed}")
            if time.time() > deadline:
                raise RuntimeError(f"warm pool not refilled in 900 s (run {i})")
            time.sleep(0.05)
        t = g.issue(f"{label}-warm-{i}")
        times.append(bl.first_query(t["dsn_plain"]))
        g.revoke(t["id"])
    return times


def measure(env, p, label, data_dir, sql, config, cold_n):
    """Cold runs with the pool off, then the same gateway restarted with a pool of 2.
    Returns (gateway, cold times, warm times or the reason there are none)."""
    t0 = time.time()
    g = bl.Gateway(env, label, data_dir, sql, config + "[pool]\nsize = 0\n" + COMMON)
    log(f"{label}: gateway ready in {time.time() - t0:.0f} s (golden built or reused)")
    try:
        cold = cold_runs(g, cold_n, label)
        g.restart(config + "[pool]\nsize = 2\n" + COMMON)
        try:
            warm = warm_runs(g, p["warm"], label)
        except RuntimeError as e:
            log(f"{label}: {e}")
            warm = str(e)
        return g, cold, warm
    finally:
        g.stop()


def seed_golden(src_root, dst_root):
    """Copies a built instance golden (`golden-<hash>`, keyed by the SQL) into another data
    dir's `pg/`, so the plain-copy gateway reuses it instead of building it again."""
    if not os.path.isdir(src_root):
        return
    os.makedirs(dst_root, exist_ok=True)
    for d in os.listdir(src_root):
        if d.startswith("golden-") and ".building" not in d:
            subprocess.run(["cp", "-a", "--reflink=never", os.path.join(src_root, d),
                            os.path.join(dst_root, d)], check=True)


def cell(text, n):
    """One markdown table cell: a line, no pipes, at most `n` characters."""
    return " ".join(text.split()).replace("|", "/")[:n]


def line(provider, mb, g_mb, how, cold, warm):
    if isinstance(warm, str):
        w, ratio = f"not measured: {cell(warm, 200)}", "–"
    else:
        w, ratio = bl.med_p99(warm), f"{pct(cold, 50) / pct(warm, 50):.1f}"
    return f"| `{provider}` | {mb} MiB ({g_mb} MB) | {how} | {bl.med_p99(cold)} | {w} | {ratio} |"


def providers(env, sz):
    """First query of a new token per provider × golden size × copy method."""
    env.pin_self_to_clients()
    p = plan(env.quick)
    if not os.path.exists(backends_binary(env)):
        raise bl.Skip(f"{backends_binary(env)} missing (cargo build --release --example bench_backends)")
    load_start = open("/proc/loadavg").read().split()[0]
    t_start = time.time()
    lines, notes = [], []

    def attempt(what, fn):
        try:
            lines.append(fn())
        except Exception as e:  # one broken combination must not hide the others
            log(f"providers: {what} failed: {e!r}")
            lines.append(f"| {what} | | | error: {type(e).__name__}: {cell(str(e), 150)} | | |")

    for mb in p["sizes"]:
        cold_n = p["cold_big"] if mb >= 1024 else p["cold"]
        sql = bl.golden_sql(os.path.join(env.dir, f"prov-{mb}.sql"), mb=mb)
        size_dirs = []
        xfs_root = None
        try:
            xdir = env.xfs_dir(8 if not env.quick else 4)
            xfs_root = os.path.join(xdir, f"prov-{mb}")
            size_dirs.append(xfs_root)
        except bl.Skip as e:
            if not notes:
                notes.append(f"no XFS rows: {e}")

        # instance, XFS reflink (when root and the loop mount works)
        if xfs_root:
            def inst_xfs():
                g, cold, warm = measure(env, p, f"prov-inst-xfs-{mb}", xfs_root, sql, "", cold_n)
                return line("instance", mb, g.golden_size_mb(), f"xfs, {g.copy_method()}", cold, warm)
            attempt(f"`instance` {mb} MiB xfs", inst_xfs)

        # instance, plain copy on the machine's file system (golden reused from XFS)
        plain_root = os.path.join(env.dir, f"prov-{mb}")
        size_dirs.append(plain_root)

        def inst_plain():
            if xfs_root:
                seed_golden(os.path.join(xfs_root, "pg"), os.path.join(plain_root, "pg"))
            g, cold, warm = measure(env, p, f"prov-inst-plain-{mb}", plain_root, sql, "", cold_n)
            return line("instance", mb, g.golden_size_mb(), f"{bl.fs_type(plain_root)}, {g.copy_method()}",
                        cold, warm)
        attempt(f"`instance` {mb} MiB plain", inst_plain)

        # remote: the sandbox service forking with the instance provider on the root above
        # whose golden is already built (XFS when there is one)
        def remote():
            root = os.path.join(xfs_root or plain_root, "pg")
            srv = Backends(env, f"prov-remote-srv-{mb}", ["remote", root, sql], env.dir)
            try:
                info = srv.info
                cfg = (f'provider = "remote"\n[remote]\nurl = "{info["url"]}"\napi_key = "{info["api_key"]}"\n'
                       f'golden = "prov-{mb}"\nsslmode = "require"\nfork_timeout = "10m"\n')
                d = os.path.join(env.dir, f"prov-remote-gw-{mb}")
                size_dirs.append(d)
                _, cold, warm = measure(env, p, f"prov-remote-{mb}", d, sql, cfg, cold_n)
                golden_mb = bl.instance_golden_mb(root)
                how = (f"HTTP sandbox service: instance fork ({bl.fs_type(root)}, {info['copy_method']}) "
                       "behind a TLS forwarder")
                return line("remote", mb, golden_mb, how, cold, warm)
            finally:
                srv.stop()
        attempt(f"`remote` {mb} MiB", remote)

        # template: CREATE DATABASE … TEMPLATE on a Postgres server started for this size
        def template():
            tmp = os.path.join(env.dir, f"prov-tpl-srv-{mb}")
            os.makedirs(tmp)
            os.chmod(tmp, 0o755)
            size_dirs.append(tmp)
            srv = Backends(env, f"prov-tpl-srv-{mb}", ["postgres"], tmp)
            try:
                cfg = (f'provider = "template"\n[template]\nadmin_dsn = "{srv.info["admin_dsn"]}"\n'
                       f'golden = "golden_{mb}"\nsslmode = "require"\n')
                d = os.path.join(env.dir, f"prov-tpl-gw-{mb}")
                size_dirs.append(d)
                # One implicit transaction on the template server: no VACUUM in it.
                tsql = bl.golden_sql(os.path.join(env.dir, f"prov-tpl-{mb}.sql"), mb=mb, vacuum=False)
                _, cold, warm = measure(env, p, f"prov-tpl-{mb}", d, tsql, cfg, cold_n)
                db_mb = template_golden_mb(srv.info["admin_dsn"], f"golden_{mb}")
                return line("template", mb, db_mb, f"{bl.fs_type(tmp)}, CREATE DATABASE … TEMPLATE "
                            "(STRATEGY default = WAL_LOG)", cold, warm)
            finally:
                srv.stop()
        attempt(f"`template` {mb} MiB", template)

        for d in size_dirs:  # the next size needs the disk
            shutil.rmtree(d, ignore_errors=True)

    load_end = open("/proc/loadavg").read().split()[0]
    table = [
        "### First query of a new token per provider: cold fork vs warm pool of 2", "",
        f"Load average (1 min) at start / end of this section: {load_start} / {load_end}; "
        f"{(time.time() - t_start) / 60:.1f} min. Median / p99 over n runs; cold with `[pool] size = 0` "
        f"({p['cold']} runs, {p['cold_big']} for 1 GiB), warm with `[pool] size = 2` ({p['warm']} runs, "
        "each after the pool is full again). Golden: MiB of table data (data directory size).", ""]
    if notes:
        table += [f"_{n}_" for n in notes] + [""]
    table += ["| provider | golden | how a fork is made | cold fork: first query | warm pool of 2: first query "
              "| cold ÷ warm (medians) |", "| --- | --- | --- | --- | --- | --- |"] + lines
    env.tables.append("\n".join(table) + "\n")
    return [Row("first query of a new token per provider × golden size × copy method, cold vs warm pool of 2",
                f"{len(lines)} combinations (table below)", "printed", "")]


def template_golden_mb(admin_dsn, db):
    """Size of the golden database on the template server, in MB."""
    with psycopg.connect(admin_dsn, sslmode="require", autocommit=True) as c:
        return round(c.execute("select pg_database_size(%s)", (db,)).fetchone()[0] / 1e6)
