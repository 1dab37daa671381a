"""Print the A/B table: python3 summ.py DIR (the JSON files run.sh wrote)."""
import json, glob, os, sys

d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ab/out"
print("task pair build | rand/raw rand/rawE | rand_sps raw_sps | engCPU rand rawE | initCPU rand rawE | env_true_ms | reset_ms")
sandbox = []
for f in sorted(glob.glob(d + "/*.json")):
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
           j["env_step_true"]["median"] - j["exec_warm_true"]["median"], r["reset_ms_per_episode"])
    print("%s %s %s | %.3f %.3f | %.0f %.0f | %.0f %.0f | %.0f %.0f | %.3f | %.2f" % row)
if sandbox:
    keys = sorted(sandbox[0][2])
    print("sandbox pair build | " + " ".join(keys))
    for pair, build, r in sandbox:
        print("sandbox %s %s | %s" % (pair, build, " ".join("%.3f" % r[k] if isinstance(r[k], (int, float)) else str(r[k]) for k in keys)))
