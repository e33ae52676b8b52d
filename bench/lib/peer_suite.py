"""A peer's own test suite through sandpit and directly, in one run (bench/peer-suite.sh).

The peer: psycopg2's unittest suite, from the `psycopg2` sdist on PyPI (the only PostgreSQL
driver sdist on a reachable registry that ships its tests and runs them against a DSN), run
on the `psycopg2-binary` wheel of the same version in a private venv. Both runs use a role
with the same privileges: through sandpit a token's `agent` (default caps); directly a stock
PostgreSQL (`initdb` defaults, same binaries) with a role `agent` made the way sandpit's
golden makes it (not a superuser; CONNECT/CREATE/TEMPORARY on the database; owner of schema
public). The figure: the tests that pass directly but not through sandpit.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from urllib.parse import unquote, urlsplit

import benchlib as bl
from sections import free_port, pgbin

PEER = "psycopg2"
VERSION = "2.9.13"
DB = "psycopg2_test"
HERE = os.path.dirname(os.path.abspath(__file__))


def sh(argv, **kw):
    return subprocess.run(argv, check=True, **kw)


def as_sandpit(argv):
    """Postgres refuses to run as root: run its tools as the unprivileged `sandpit` user."""
    return (["runuser", "-u", "sandpit", "--"] if os.getuid() == 0 else []) + argv


def prepare_peer(cache):
    """The suite's source tree and a venv with the driver; kept in `cache` between runs."""
    src = os.path.join(cache, f"{PEER}-{VERSION}")
    if not os.path.isdir(os.path.join(src, "tests")):
        os.makedirs(cache, exist_ok=True)
        bl.log(f"downloading the {PEER}=={VERSION} sdist (for its tests/)")
        sh([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
            ":all:", f"{PEER}=={VERSION}", "-d", cache])
        with tarfile.open(os.path.join(cache, f"{PEER}-{VERSION}.tar.gz")) as t:
            t.extractall(cache, filter="data")
    venv = os.path.join(cache, "venv")
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", f"import psycopg2, sys; sys.exit(not psycopg2.__version__.startswith('{VERSION}'))"]
    if not os.path.exists(py) or subprocess.run(probe, capture_output=True).returncode != 0:
        bl.log(f"venv with psycopg2-binary=={VERSION}")
        sh([sys.executable, "-m", "venv", venv])
        sh([py, "-m", "pip", "install", "--quiet", f"psycopg2-binary=={VERSION}"])
    return src, py


def stock_postgres(env, password):
    """initdb + postgres as `sandpit` on a free loopback port; SCRAM for TCP."""
    data = os.path.join(env.dir, "stock")
    sock = os.path.join(env.dir, "stock-sock")
    for d in (data, sock):
        os.makedirs(d)
        if os.getuid() == 0:
            shutil.chown(d, "sandpit", "sandpit")
    pwfile = os.path.join(env.dir, "stock-pw")
    sh(as_sandpit([pgbin("initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync",
                   "-E", "UTF8", "--locale=C.UTF-8"]), capture_output=True)
    with open(os.path.join(data, "pg_hba.conf"), "w") as f:
        f.write("local all postgres trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
    port = free_port()
    log = open(os.path.join(env.dir, "stock.log"), "w")
    p = subprocess.Popen(env.server_cmd(as_sandpit([
        pgbin("postgres"), "-D", data, "-p", str(port), "-k", sock,
        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])), stdout=log, stderr=log)
    env.procs.append(p)
    psql = [pgbin("psql"), "-h", sock, "-p", str(port), "-U", "postgres", "-X", "-q",
            "-v", "ON_ERROR_STOP=1"]
    for _ in range(600):
        if subprocess.run(as_sandpit(psql + ["-c", "select 1"]), capture_output=True).returncode == 0:
            break
        if p.poll() is not None:
            raise RuntimeError(f"stock postgres exited: {open(log.name).read()[-500:]}")
        time.sleep(0.1)
    # The same role shape as sandpit's golden (src/provider/golden.rs create_roles).
    for stmt in [
        "CREATE ROLE agent LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
        f"PASSWORD '{password}'",
        f"CREATE DATABASE {DB} OWNER postgres",
        f"REVOKE ALL ON DATABASE {DB} FROM PUBLIC",
        f"GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {DB} TO agent",
    ]:
        sh(as_sandpit(psql + ["-d", "postgres", "-c", stmt]), capture_output=True)
    sh(as_sandpit(psql + ["-d", DB, "-c", "ALTER SCHEMA public OWNER TO agent"]), capture_output=True)
    return port


def run_suite(env, src, py, label, host, port, user, password, only, cap, per_test):
    out = os.path.join(env.dir, f"{label}.jsonl")
    e = dict(os.environ, PSYCOPG2_TESTDB=DB, PSYCOPG2_TESTDB_HOST=host,
             PSYCOPG2_TESTDB_PORT=str(port), PSYCOPG2_TESTDB_USER=user,
             PSYCOPG2_TESTDB_PASSWORD=password)
    for k in ("PGPASSWORD", "PGOPTIONS", "PGSSLMODE", "PGDATABASE", "PSYCOPG2_TEST_REPL_DSN"):
        e.pop(k, None)
    bl.log(f"{label}: running the {PEER} suite (cap {cap} s)")
    t0 = time.time()
    argv = env.client_cmd([py, os.path.join(HERE, "peer_runner.py"), out, "tests", ",".join(only),
                           str(per_test)])
    try:
        r = subprocess.run(argv, cwd=src, env=e, capture_output=True, text=True, timeout=cap)
        status = "complete" if r.returncode == 0 else f"runner exit {r.returncode}: {r.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        status = f"cut at the {cap} s cap"
    results = {}
    if os.path.exists(out):
        for line in open(out):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            results.setdefault(rec["id"], rec)
            if rec["outcome"] != "ok":
                results[rec["id"]] = rec
    bl.log(f"{label}: {len(results)} tests in {time.time() - t0:.0f} s ({status})")
    return results, status, time.time() - t0


def counts(res):
    c = {}
    for rec in res.values():
        c[rec["outcome"]] = c.get(rec["outcome"], 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items()))


def report(direct, through, dstat, tstat, dsecs, tsecs, only, caps):
    regress = sorted(t for t, r in direct.items()
                     if r["outcome"] == "ok" and through.get(t, {}).get("outcome") in ("fail", "error"))
    skipped = sorted(t for t, r in direct.items()
                     if r["outcome"] == "ok" and through.get(t, {}).get("outcome") == "skip")
    missing = sorted(t for t, r in direct.items() if r["outcome"] == "ok" and t not in through)
    md = [f"Peer suite: {PEER} {VERSION} unittest suite"
          + (f" (modules: {', '.join(only)})" if only else " (all modules)")
          + f", run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
          f"- direct (stock PostgreSQL): {counts(direct)} in {dsecs:.0f} s ({dstat})",
          f"- through sandpit (a token, {', '.join(f'{k} {v}' for k, v in caps.items()) or 'default caps'}): {counts(through)} in {tsecs:.0f} s ({tstat})",
          f"- pass directly, fail through sandpit: **{len(regress)}**",
          f"- pass directly, skipped through sandpit: {len(skipped)}",
          f"- pass directly, not reached through sandpit (run cut): {len(missing)}",
          ""]
    if regress:
        md += ["| test | through sandpit |", "|---|---|"]
        md += [f"| `{t}` | {through[t]['outcome']}: {through[t]['msg'].replace('|', '/')} |" for t in regress]
        md.append("")
    if skipped:
        md += ["Skipped through sandpit only:", ""]
        md += [f"- `{t}`: {through[t]['msg']}" for t in skipped]
        md.append("")
    both = sorted(t for t, r in direct.items() if r["outcome"] in ("fail", "error"))
    if both:
        md += ["Failing directly (stock server; not counted):", ""]
        md += [f"- `{t}`: {direct[t]['outcome']}: {direct[t]['msg']} (through sandpit: "
               f"{through.get(t, {}).get('outcome', 'not run')})" for t in both]
        md.append("")
    return "\n".join(md), regress


def main():
    root = os.path.dirname(os.path.dirname(HERE))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(target, "debug", "sandpit"))
    ap.add_argument("--only", default="", help="comma-separated test modules, e.g. test_connection,test_cursor")
    ap.add_argument("--cap", type=int, default=900, help="seconds per side (default 900)")
    ap.add_argument("--per-test", type=int, default=120, help="seconds per test (default 120)")
    ap.add_argument("--max-rows", type=int, help="the token's max_rows (default: the gateway's, 200)")
    ap.add_argument("--max-bytes", type=int, help="the token's max_bytes (default: the gateway's, 1 MiB)")
    ap.add_argument("--out", default=os.path.join(target, "peer-suite.md"))
    a = ap.parse_args()
    only = [m for m in a.only.split(",") if m]
    src, py = prepare_peer(os.path.join(target, "peer-suite"))
    env = bl.Env(a.binary, quick=False)
    try:
        golden = os.path.join(env.dir, "golden.sql")
        with open(golden, "w") as f:
            f.write("create table peer_suite_marker(id int);\n")
        g = bl.Gateway(env, "peer", os.path.join(env.dir, "gw"), golden)
        caps = {k: v for k, v in (("max_rows", a.max_rows), ("max_bytes", a.max_bytes)) if v}
        tok = g.issue("peer-suite", ttl=7200, max_connections=40, **caps)
        u = urlsplit(tok["dsn"])
        password = "stock-" + os.urandom(8).hex()
        port = stock_postgres(env, password)
        direct, dstat, dsecs = run_suite(env, src, py, "direct", "127.0.0.1", port, "agent",
                                         password, only, a.cap, a.per_test)
        through, tstat, tsecs = run_suite(env, src, py, "sandpit", u.hostname, u.port,
                                          unquote(u.username), unquote(u.password), only, a.cap,
                                          a.per_test)
        if not direct or not through:
            raise SystemExit(f"the suite did not run: direct {dstat}; through sandpit {tstat}")
        md, regress = report(direct, through, dstat, tstat, dsecs, tsecs, only, caps)
        print(md)
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(md + "\n")
        bl.log(f"written to {a.out}; {len(regress)} pass directly but fail through sandpit")
    finally:
        env.cleanup()


if __name__ == "__main__":
    main()
