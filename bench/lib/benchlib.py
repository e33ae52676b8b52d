"""Pieces the benchmark sections share: gateways, tokens, timing, statistics, cleanup."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import psycopg


class Skip(Exception):
    """A section that cannot run on this machine (the reason is printed in the table)."""


class Row:
    """One line of the report: figure, measured value, target, verdict or note."""

    def __init__(self, figure, measured, target, note=""):
        self.figure, self.measured, self.target, self.note = figure, measured, target, note


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-p * len(v) // 100)) - 1))
    return v[k]


def med_p99(values, unit="ms", fmt="{:.1f}"):
    return f"{fmt.format(pct(values, 50))} / {fmt.format(pct(values, 99))} {unit} (n={len(values)})"


def golden_sql(path, mb=0, rows=0, vacuum=True):
    """A golden whose data directory grows by about `mb` MiB: 900-byte rows stay inline and
    uncompressed (below the TOAST threshold), about 8 to a page. `vacuum=False` for the
    template provider, which runs the file as one implicit transaction (VACUUM refuses)."""
    n = rows or mb * 1024 * 8 * 1024 // 8192
    with open(path, "w") as f:
        f.write("create table filler(id int primary key, pad text not null);\n"
                f"insert into filler select g, repeat(md5(g::text), 28) from generate_series(1, {n}) g;\n"
                + ("vacuum analyze filler;\n" if vacuum else "analyze filler;\n"))
    return path


class Env:
    """The run's scratch space: temp dirs, CPU split, an optional loop-mounted XFS, and
    everything started (killed and removed at the end)."""

    def __init__(self, binary, quick, pinned=True):
        self.binary = binary
        self.quick = quick
        self.root = os.getuid() == 0
        self.dir = tempfile.mkdtemp(prefix="sandpit-bench-", dir="/var/tmp")
        os.chmod(self.dir, 0o755)
        self.procs = []
        self.mounts = []
        self.notes = []
        # Markdown blocks a section prints after the main table (e.g. a table of its own).
        self.tables = []
        n = os.cpu_count() or 1
        affinity = sorted(os.sched_getaffinity(0))
        self.pinned = pinned
        # Every gateway's `relay_threads` (bench/run --relay-threads); 0: the config's default.
        self.relay_threads = 0
        if pinned and len(affinity) >= 2:
            # Servers (gateway, the Postgres it starts, PgBouncer) share one core, clients
            # (pgbench, psql, the Python driver) the other, so neither starves the other.
            self.server_cpus = str(affinity[0])
            self.client_cpus = ",".join(str(c) for c in affinity[1:])
        else:
            self.server_cpus = self.client_cpus = None
        self.ncpu = n
        self.xfs = None
        self.xfs_error = None
        self.fs = fs_type(self.dir)
        self.load_start = open("/proc/loadavg").read().split()[0]

    # -- processes -------------------------------------------------------------
    def server_cmd(self, argv):
        return (["taskset", "-c", self.server_cpus] if self.server_cpus else []) + argv

    def client_cmd(self, argv):
        return (["taskset", "-c", self.client_cpus] if self.client_cpus else []) + argv

    def pin_self_to_clients(self):
        if self.client_cpus:
            os.sched_setaffinity(0, {int(c) for c in self.client_cpus.split(",")})

    # -- XFS -------------------------------------------------------------------
    def xfs_dir(self, size_gb):
        """A directory on a fresh loop-mounted XFS with reflink, or raise Skip with why."""
        if self.xfs:
            return self.xfs
        if self.xfs_error:
            raise Skip(self.xfs_error)
        why = None
        if not self.root:
            why = "not root: cannot loop-mount a file system"
        elif not shutil.which("mkfs.xfs"):
            why = "mkfs.xfs missing (apt xfsprogs)"
        if why is None:
            img = os.path.join(self.dir, "xfs.img")
            mnt = os.path.join(self.dir, "xfs")
            os.makedirs(mnt)
            with open(img, "wb") as f:
                f.truncate(size_gb << 30)
            r = subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", img], capture_output=True, text=True)
            if r.returncode == 0:
                r = subprocess.run(["mount", "-o", "loop", img, mnt], capture_output=True, text=True)
                if r.returncode == 0:
                    self.mounts.append(mnt)
                    os.chmod(mnt, 0o755)
                    self.xfs = mnt
                    return mnt
            why = f"loop-mounted XFS refused: {r.stderr.strip()[:200]}"
        self.xfs_error = why
        raise Skip(why)

    def cleanup(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for m in self.mounts:
            subprocess.run(["umount", m], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class Gateway:
    """A `sandpit serve` on ephemeral ports, pinned to the server core."""

    def __init__(self, env, name, data_dir, golden, config=""):
        self.env = env
        self.data_dir = data_dir
        os.makedirs(data_dir, exist_ok=True)
        self.conf = os.path.join(env.dir, f"{name}.toml")
        self.golden = golden
        self.name = name
        self.proc = None
        self.start(config)

    def start(self, config=""):
        if self.env.relay_threads:
            # A top-level key: before the config's first table.
            config = f"relay_threads = {self.env.relay_threads}\n" + config
        with open(self.conf, "w") as f:
            f.write(config)
        out = os.path.join(self.env.dir, f"{self.name}.out")
        self.log_path = os.path.join(self.env.dir, f"{self.name}.log")
        t0 = time.time()
        self.proc = subprocess.Popen(
            self.env.server_cmd([self.env.binary, "serve", "--config", self.conf, "--data-dir",
                                 self.data_dir, "--listen", "127.0.0.1:0", "--api-listen",
                                 "127.0.0.1:0", "--golden-sql", self.golden, "--log-format", "text"]),
            stdout=open(out, "w"), stderr=open(self.log_path, "a"))
        self.env.procs.append(self.proc)
        while True:
            text = open(out).read()
            if "sandpit ready" in text:
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway {self.name} exited: {open(self.log_path).read()[-500:]}")
            if time.time() - t0 > 600:
                raise RuntimeError(f"gateway {self.name} not ready in 600 s")
            time.sleep(0.05)
        self.ready_secs = time.time() - t0
        line = [ln for ln in text.splitlines() if "sandpit ready" in ln][0]
        self.pg = line.split("postgres=")[1].split()[0]
        self.api = line.split("api=")[1].split()[0]
        self.key = open(os.path.join(self.data_dir, "admin.key")).read().strip()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)

    def restart(self, config=""):
        self.stop()
        self.start(config)

    def http(self, method, path, body=None, timeout=60):
        req = urllib.request.Request(self.api + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.key}",
                                              "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
            return json.loads(data) if data and r.headers.get("content-type", "").startswith("application/json") else data

    def issue(self, task, ttl=3600, **caps):
        t = self.http("POST", "/v1/tokens", dict(task=task, ttl_seconds=ttl, **caps))
        t["dsn_plain"] = t["dsn"] + ("&" if "?" in t["dsn"] else "?") + "sslmode=disable"
        return t

    def revoke(self, tid, timeout=60):
        """Ends a token and waits for its end (its review is stored before the answer): a
        big change takes longer, and a revoke left running would be measured by the next
        section."""
        try:
            self.http("DELETE", f"/v1/tokens/{tid}", timeout=timeout)
        except Exception as e:  # already expired is fine
            log(f"revoke {tid}: {e}")

    def metric(self, name):
        text = self.http("GET", "/metrics")
        text = text.decode() if isinstance(text, bytes) else str(text)
        for ln in text.splitlines():
            if ln.startswith(name + " ") or ln.startswith(name + "{"):
                return float(ln.rsplit(" ", 1)[1])
        return None

    def summary_medians(self, name, label, quantile="0.5"):
        """{label value: median in ms} of a summary metric (`quantile="0.5"` series; another
        quantile when asked, e.g. "0.99")."""
        text = self.http("GET", "/metrics")
        text = text.decode() if isinstance(text, bytes) else str(text)
        out = {}
        for ln in text.splitlines():
            if ln.startswith(name + "{") and f'quantile="{quantile}"' in ln:
                labels = ln[len(name) + 1:ln.index("}")]
                for kv in labels.split(","):
                    k, _, v = kv.partition("=")
                    if k == label:
                        out[v.strip('"')] = float(ln.rsplit(" ", 1)[1]) * 1000
        return out

    def instance_dir(self, tid):
        return os.path.join(self.data_dir, "pg", "instances", tid, "data")

    def postmaster(self, tid):
        """(pid, socket dir) of the token's scratch server, from its postmaster.pid."""
        lines = open(os.path.join(self.instance_dir(tid), "postmaster.pid")).read().splitlines()
        return int(lines[0]), lines[4]

    def rss_kib(self):
        for ln in open(f"/proc/{self.proc.pid}/status"):
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
        raise RuntimeError("no VmRSS")

    def copy_method(self):
        for ln in open(self.log_path):
            if "copy_method" in ln:
                return ln.split("copy_method=")[1].split()[0].strip('"')
        return "unknown"

    def golden_size_mb(self):
        return instance_golden_mb(os.path.join(self.data_dir, "pg"))


def instance_golden_mb(pg_root):
    """Apparent size in MB of the instance provider's golden data directory under `pg_root`."""
    best = 0
    for d in os.listdir(pg_root):
        if d.startswith("golden"):
            out = subprocess.run(["du", "-sm", "--apparent-size", os.path.join(pg_root, d)], capture_output=True, text=True).stdout
            best = max(best, int(out.split()[0] or 0)) if out else best
    return best


def first_query(dsn):
    """Milliseconds from connect to the first row of `select 1` (SCRAM, no TLS)."""
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("select 1").fetchone()
        t1 = time.perf_counter()
    return (t1 - t0) * 1000


def first_query_split(dsn):
    """(total, connect, query) milliseconds of a first query: `psycopg.connect` returning
    (startup, SCRAM, the claim, the backend connection, the greeting), then `select 1`."""
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        t1 = time.perf_counter()
        c.execute("select 1").fetchone()
        t2 = time.perf_counter()
    return (t2 - t0) * 1000, (t1 - t0) * 1000, (t2 - t1) * 1000


def fs_type(path):
    out = subprocess.run(["df", "--output=fstype", path], capture_output=True, text=True).stdout.split()
    return out[-1] if out else "?"
