#!/usr/bin/env python3
"""summ.py [DIR]: summary of DIR/*.json (default runs/; after/ is the other set), each run of
engine bench env --workers 1,2,3: per worker count, each ratio and each agent's idle CPU share,
engine and init CPU per step and steps/s, as run values and mean with a 95% t-interval over
the runs."""
import glob, json, math, os, statistics as st, sys

CPUS = 2  # the machine these runs were made on
T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365}
here = os.path.dirname(os.path.abspath(__file__))
which = sys.argv[1] if len(sys.argv) > 1 else "runs"
runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(here, which, "*.json")))]


def line(name, xs, fmt="%.3f", scale=1.0):
    xs = [x * scale for x in xs]
    m = st.mean(xs)
    h = T95.get(len(xs), 2.0) * st.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    vals = " ".join(fmt % x for x in xs)
    print(f"  {name:<44} {vals}   mean {fmt % m} ± {fmt % h}")


print(f"{which}: {len(runs)} runs of engine bench env --task archive-logs --workers 1,2,3 --seconds 8")
for w in (1, 2, 3):
    print(f"## {w} worker(s)")
    for key, name in (("random_vs_raw", "random / raw-exec"),
                      ("random_vs_raw_episodes", "random / raw-exec-episodes")):
        line(name, [q["ratio"] for r in runs for q in r[key] if q["workers"] == w])
    for agent in ("raw-exec", "raw-exec-episodes", "random"):
        rows = [t for r in runs for t in r["throughput"] if t["agent"] == agent and t["workers"] == w]
        line(f"{agent}: CPU idle (%)", [t["idle_cpu_share"] for t in rows], "%.1f", 100.0)
        line(f"{agent}: engine CPU per step (us)", [t["engine_cpu_us_per_step"] for t in rows], "%.0f")
        line(f"{agent}: init CPU per step (us)", [t["init_cpu_us_per_step"] for t in rows], "%.0f")
        line(f"{agent}: steps/s", [t["steps_per_s"] for t in rows], "%.0f")
        # Busy CPU per step: the machine's CPUs (2 here) times the busy share, over the rate.
        line(f"{agent}: busy CPU per step (ms)",
             [CPUS * (1 - t["idle_cpu_share"]) / t["steps_per_s"] * 1e3 for t in rows], "%.2f")
