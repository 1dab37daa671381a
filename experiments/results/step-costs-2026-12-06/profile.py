"""Where the engine's samples under Env::step and Env::reset went, from `perf script -F tid,ip,sym`
of `perf record -F 2500 --call-graph dwarf,16384 -- engine bench env --task archive-logs
--workers 1 --seconds 6 --iterations 2` (base build, 4b2bf30). Usage: python3 profile.py SCRIPT."""
import collections, sys

blocks, block = [], []
for line in open(sys.argv[1]):
    if line.strip() == "":
        if block:
            blocks.append([l.strip().split(" ", 1)[1] if " " in l.strip() else l.strip() for l in block[1:]])
        block = []
    else:
        block.append(line)


def under(key, names):
    total, incl = 0, collections.Counter()
    for syms in blocks:
        if not any(key in s for s in syms):
            continue
        total += 1
        for n in names:
            if any(n in s for s in syms):
                incl[n] += 1
    print("samples with %s in the chain: %d" % (key, total))
    for n in names:
        print("  %5d  %4.1f%%  %s" % (incl[n], 100 * incl[n] / max(total, 1), n))


under("Env::step", ["RunningInstance::run_agent", "Cgroup::oom_kills", "RunningInstance::judge",
                    "tasks::util::facts", "Env::observe", "Sandbox::overview", "engine::env::render",
                    "FeatureLayout::encode"])
under("Env::reset", ["RunningInstance::restart", "Env::observe", "Sandbox::overview", "RunningInstance::judge"])
