#!/usr/bin/env python3
"""Whole-process `engine sandbox exec -- /bin/true` of two engine builds, interleaved with
bubblewrap (`--unshare-all`, read-only host root, /proc, /dev) in one run: wall and CPU
(user + system of the process and its children, getrusage) medians, and the ratios.
Interleaving keeps a busy machine's load the same for all three. Needs root and bwrap
(benches/compare.sh installs it).

Usage: benches/oneshot_ab.py OLD_ENGINE NEW_ENGINE [RUNS]   (prints JSON)"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

old, new = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 60
env = dict(os.environ)
cmds = {
    "before": [old, "sandbox", "exec", "--", "/bin/true"],
    "after": [new, "sandbox", "exec", "--", "/bin/true"],
    "bwrap": ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc",
              "--dev", "/dev", "/bin/true"],
}
wall = {k: [] for k in cmds}
cpu = {k: [] for k in cmds}
# Each build its own state directory: a remembered host walk is keyed by the program that
# made it, so two builds sharing one would each walk the host again at every run.
base = env.get("ENVFACTORY_STATE", "/var/lib/envfactory")
envs = {k: dict(env, ENVFACTORY_STATE=f"{base}-ab-{k}") for k in ("before", "after")}
envs["bwrap"] = env
for k, c in cmds.items():
    for _ in range(3):
        subprocess.run(c, env=envs[k], stdout=subprocess.DEVNULL, check=True)
for _ in range(runs):
    for k, c in cmds.items():
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(c, env=envs[k], stdout=subprocess.DEVNULL, check=True)
        t1 = time.perf_counter()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall[k].append((t1 - t0) * 1000)
        cpu[k].append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1000)
out = {k: {"wall_ms": round(statistics.median(wall[k]), 2),
           "cpu_ms": round(statistics.median(cpu[k]), 2)} for k in cmds}
for k in ("before", "after"):
    for m in ("wall", "cpu"):
        out[k][f"{m}_vs_bwrap"] = round(out[k][f"{m}_ms"] / out["bwrap"][f"{m}_ms"], 2)
for m in ("wall", "cpu"):
    out[f"after_vs_before_{m}"] = round(out["after"][f"{m}_ms"] / out["before"][f"{m}_ms"], 2)
out["loadavg"] = os.getloadavg()
print(json.dumps(out, indent=1))
