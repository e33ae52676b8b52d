"""microvm provider beside instance, in one run: restore (fork) to first query, idle PSS per
backend, and 20 backends forked at once. Printed, never asserted. Usage: see bench/microvm.sh."""
import concurrent.futures as cf
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import benchlib as bl  # noqa: E402
from benchlib import log, med_p99  # noqa: E402

GOLDEN = "create table items(id int primary key, name text not null);\n" \
         "insert into items select g, 'item ' || g from generate_series(1, 1000) g;\n"


def pss_kib(pids):
    total = 0
    for pid in pids:
        try:
            for ln in open(f"/proc/{pid}/smaps_rollup"):
                if ln.startswith("Pss:"):
                    total += int(ln.split()[1])
        except OSError:
            pass
    return total


def children(pid):
    """pid and its descendants (a postmaster and its backends)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                kids = open(f"/proc/{p}/task/{t}/children").read().split()
                todo.extend(int(k) for k in kids)
        except OSError:
            pass
    return out


def backend_pids(g, provider, tid):
    if provider == "microvm":
        pid = int(open(os.path.join(g.data_dir, "microvm", "vms", tid, "qemu.pid")).read())
        return [pid]
    pid, _ = g.postmaster(tid)
    return children(pid)


def measure(env, provider, runs, clones, image_dir):
    config = "[review]\non_end = false\n"
    if provider == "microvm":
        config = f"provider = \"microvm\"\n[microvm]\nimage_dir = \"{image_dir}\"\n" \
                 f"boot_timeout = \"600s\"\n" + config
    golden = os.path.join(env.dir, "golden.sql")
    open(golden, "w").write(GOLDEN)
    g = bl.Gateway(env, provider, os.path.join(env.dir, provider), golden, config)
    log(f"{provider}: gateway ready in {g.ready_secs:.1f} s (image and golden snapshot included)")
    res = {"ready_s": g.ready_secs}
    times = []
    for i in range(runs):
        t = g.issue(f"{provider}-cold-{i}")
        times.append(bl.first_query(t["dsn_plain"]))
        g.revoke(t["id"])
    res["first_query"] = times
    # `clones` backends forked at once, then idle.
    toks = [g.issue(f"{provider}-many-{i}") for i in range(clones)]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clones) as ex:
        firsts = list(ex.map(lambda t: bl.first_query(t["dsn_plain"]), toks))
    res["all_wall_s"] = time.perf_counter() - t0
    res["all_first"] = firsts
    time.sleep(10)
    per = [pss_kib(backend_pids(g, provider, t["id"])) / 1024 for t in toks]
    res["pss_mib"] = per
    for t in toks:
        g.revoke(t["id"])
    g.stop()
    return res


def main():
    binary, quick = sys.argv[1], "--quick" in sys.argv
    image_dir = os.environ.get("SANDPIT_MICROVM_IMAGE_DIR", "/var/tmp/sandpit-microvm-images")
    runs = 5 if quick else 15
    clones = 20
    env = bl.Env(binary, quick)
    try:
        out = {p: measure(env, p, runs, clones, image_dir) for p in ("instance", "microvm")}
    finally:
        env.cleanup()
    print(f"\n## microvm vs instance ({'quick' if quick else 'full'}; binary {binary})\n")
    print("| figure | instance | microvm |\n|---|---|---|")
    rows = [
        ("fork (restore) to first `select 1`, median / p99",
         lambda r: med_p99(r["first_query"])),
        (f"{clones} forked at once: wall time until all answered",
         lambda r: f"{r['all_wall_s']:.1f} s"),
        (f"{clones} forked at once: first query, median / p99",
         lambda r: med_p99(r["all_first"])),
        ("idle PSS per backend, median / max",
         lambda r: f"{bl.pct(r['pss_mib'], 50):.0f} / {max(r['pss_mib']):.0f} MiB"),
        ("gateway start (golden build; microvm: boot + snapshot)",
         lambda r: f"{r['ready_s']:.0f} s"),
    ]
    for name, f in rows:
        print(f"| {name} | {f(out['instance'])} | {f(out['microvm'])} |")
    print(f"\nmachine: {os.cpu_count()} cores, load at start {env.load_start}; microvm under "
          "TCG software emulation (no hardware KVM here)")


if __name__ == "__main__":
    main()
