"""Print the A/B tables: python3 summ.py DIR... (the JSON files run.sh wrote; pairs numbered
distinctly across the directories, as out/ and out2/ are)."""
import json, glob, os, sys

dirs = sys.argv[1:] or ["/tmp/ab/out"]
files = sorted(f for d in dirs for f in glob.glob(d + "/*.json"))
print("task pair build | rand/raw rand/rawE | rand_sps raw_sps | engCPU rand rawE | initCPU rand rawE | env_true_ms | reset_ms | exec_warm exec_after_reset host ms")
sandbox = []
for f in files:
    try:
        j = json.load(open(f))
    except Exception:
        continue
    name = os.path.basename(f)[:-5]
    task, pair, build = name.rsplit("-", 2)
    if task == "compare":
        m = {r["command"]: r["median"] * 1e3 for r in j["results"]}
        print("compare.sh %s %s: served %.2f ms, own %.2f ms, bwrap %.2f ms (medians); served / bwrap %.3f"
              % (pair, build, m["engine sandbox exec (daemon)"], m["engine sandbox exec"],
                 m["bwrap --unshare-all"], m["engine sandbox exec (daemon)"] / m["bwrap --unshare-all"]))
        continue
    if task == "sandbox":
        sandbox.append((pair, build, j["ratios"]))
        continue
    t = {x["agent"]: x for x in j["throughput"] if x["workers"] == 2}
    r, raw, rawe = t["random"], t["raw-exec"], t["raw-exec-episodes"]
    row = (task, pair, build, j["random_vs_raw"][0]["ratio"], j["random_vs_raw_episodes"][0]["ratio"],
           r["steps_per_s"], raw["steps_per_s"], r["engine_cpu_us_per_step"], rawe["engine_cpu_us_per_step"],
           r["init_cpu_us_per_step"], rawe["init_cpu_us_per_step"],
           j["env_step_true"]["median"] - j["exec_warm_true"]["median"], r["reset_ms_per_episode"],
           j["exec_warm_true"]["median"], j["exec_sh_true"]["median"], j["host_sh_true"]["median"])
    print("%s %s %s | %.3f %.3f | %.0f %.0f | %.0f %.0f | %.0f %.0f | %.3f | %.2f | %.3f %.3f %.3f" % row)
if sandbox:
    keys = sorted(sandbox[0][2])
    print("sandbox pair build | " + " ".join(keys))
    for pair, build, r in sandbox:
        print("sandbox %s %s | %s" % (pair, build, " ".join("%.3f" % r[k] if isinstance(r[k], (int, float)) else str(r[k]) for k in keys)))

# Per task and build: the mean of random / raw-exec over the runs with a 95% t-interval, and
# the same for the paired difference new - base (pairs run back to back).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def interval(xs):
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
    return m, T95.get(n - 1, 2.0) * sd / n ** 0.5


ratios = {}
for f in files:
    name = os.path.basename(f)[:-5]
    task, pair, build = name.rsplit("-", 2)
    if task in ("compare", "sandbox"):
        continue
    try:
        j = json.load(open(f))
    except Exception:
        continue
    ratios.setdefault(task, {}).setdefault(build, {})[pair] = j["random_vs_raw"][0]["ratio"]
for task, b in sorted(ratios.items()):
    for build in ("base", "new"):
        xs = list(b.get(build, {}).values())
        if xs:
            m, h = interval(xs)
            print("%s %s: random / raw-exec mean %.3f ± %.3f (95%%, n=%d), min %.3f, >= 0.9 in %d"
                  % (task, build, m, h, len(xs), min(xs), sum(x >= 0.9 for x in xs)))
    pairs = sorted(set(b.get("base", {})) & set(b.get("new", {})))
    if pairs:
        m, h = interval([b["new"][p] - b["base"][p] for p in pairs])
        print("%s new - base (paired, n=%d): %+.3f ± %.3f" % (task, len(pairs), m, h))
