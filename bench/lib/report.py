"""The markdown report: machine facts, what was run, the table; spliced into
docs/BENCHMARKS.md between the bench markers so the hand-written analysis stays."""
import os
import platform
import subprocess
import time

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def _sh(argv, cwd=None):
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=cwd).stdout.strip()
    except OSError:
        return "?"


def commit_at_start(root):
    """HEAD when the run starts, marked when code (not the docs) has uncommitted changes."""
    commit = _sh(["git", "rev-parse", "--short", "HEAD"], cwd=root)
    changed = _sh(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                   ":!docs", ":!README.md"], cwd=root)
    return commit + (" (+ uncommitted changes)" if changed else "")


def machine(env, root):
    mem = "?"
    for ln in open("/proc/meminfo"):
        if ln.startswith("MemTotal:"):
            mem = f"{int(ln.split()[1]) / 1048576:.1f} GiB"
    cpu = "?"
    for ln in open("/proc/cpuinfo"):
        if ln.startswith("model name"):
            cpu = ln.split(":", 1)[1].strip()
            break
    commit = env.commit
    fs = [env.fs]
    return [
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- commit: `{commit}`",
        f"- machine: `nproc` {os.cpu_count()} ({cpu}), memory {mem}, kernel {platform.release()}, "
        f"scratch file system {fs[0]}" + (", plus a loop-mounted XFS (reflink=1) for the XFS rows"
                                          if env.xfs else ""),
        f"- PostgreSQL {(_sh(['psql', '--version']).split() + ['?'] * 3)[2]}, "
        f"{_sh(['pgbouncer', '--version']).splitlines()[0] if _sh(['pgbouncer', '--version']) else 'no PgBouncer'}",
        f"- load average (1 min) at start / end: {env.load_start} / {open('/proc/loadavg').read().split()[0]} "
        "(the machine is shared; other work was running)",
        "- cores: " + (f"servers (gateway, every Postgres it starts, PgBouncer) pinned to CPU "
                       f"{env.server_cpus}, clients (pgbench, psql, the Python driver) to CPU {env.client_cpus} "
                       "with `taskset`" if env.server_cpus
                       else "not pinned (`--unpinned`): clients and servers share every core"
                       if not env.pinned and env.ncpu > 1 else "one core: clients and servers share it"),
    ] + ([f"- gateways run with `relay_threads = {env.relay_threads}` (`--relay-threads`)"]
         if env.relay_threads else [])


def render(rows, env, sz, quick, secs, root):
    kind = "quick (`bench/run --quick`)" if quick else "full (`bench/run`)"
    out = [f"Run: {kind}, {secs / 60:.1f} min.", ""] + machine(env, root) + [
        f"- sizes: big golden ≈ {sz['big_mb']} MiB of table, pgbench scale {sz['pg_scale']}, "
        f"{sz['pg_secs']} s per pgbench run, capped table {sz['cap_rows']:,} rows, "
        f"{sz['idle']} idle sessions, {sz['burst']} tokens at once; {sz['runs']} runs per first-query "
        f"figure ({sz['copy_runs']} for the plain-copy big golden)",
        "", "Values are median / p99 over the runs unless marked otherwise.", "",
        "| figure | measured | target | |", "| --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r.figure} | {r.measured} | {r.target} | {r.note} |")
    for t in env.tables:
        out += ["", t.rstrip("\n")]
    return "\n".join(out) + "\n"


def write(path, md):
    old = open(path).read() if os.path.exists(path) else ""
    block = f"{START}\n{md}{END}"
    if START in old and END in old:
        new = old.split(START)[0] + block + old.split(END, 1)[1]
    else:
        new = "# Benchmarks\n\n" + block + "\n" + old
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(new)
