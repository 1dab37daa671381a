#!/usr/bin/env python3
# summ.py DIR: the 2-worker rows of DIR/{base,new}N.json. Paired new/base steps/s (geometric
# mean, 95% interval from the t distribution of the log ratios); per binary, random / raw-exec
# and random / raw-exec-episodes (mean, 95% interval over the runs), busy CPU per step
# (2 CPUs x (1 - idle share) / steps/s) and the engine's and init's CPU per random step.
import json, math, os, statistics as st, sys
T = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
def ci(xs):
    m = st.mean(xs)
    return m, (T[len(xs)] * st.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float('nan'))
def rows(f):
    return {t['agent']: t for t in json.load(open(f))['throughput'] if t['workers'] == 2}
d = sys.argv[1]
pairs = []
for i in range(1, 20):
    b, n = os.path.join(d, f'base{i}.json'), os.path.join(d, f'new{i}.json')
    if os.path.exists(b) and os.path.exists(n):
        pairs.append((rows(b), rows(n)))
busy = lambda t: 2 * (1 - t['idle_cpu_share']) / t['steps_per_s'] * 1e3
print(f'{d}: {len(pairs)} pairs')
for a in ['raw-exec', 'raw-exec-episodes', 'random', 'oracle', 'catalogue']:
    m, h = ci([math.log(n[a]['steps_per_s'] / b[a]['steps_per_s']) for b, n in pairs])
    print(f'  {a:18s} steps/s new/base {math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]')
for lab, k in (('base', 0), ('new', 1)):
    r = [p[k]['random']['steps_per_s'] / p[k]['raw-exec']['steps_per_s'] for p in pairs]
    re_ = [p[k]['random']['steps_per_s'] / p[k]['raw-exec-episodes']['steps_per_s'] for p in pairs]
    ee = [p[k]['raw-exec-episodes']['steps_per_s'] / p[k]['raw-exec']['steps_per_s'] for p in pairs]
    print(f'  {lab}: random/raw-exec {ci(r)[0]:.3f} ± {ci(r)[1]:.3f} ({", ".join(f"{x:.3f}" for x in r)});'
          f' random/raw-exec-episodes {ci(re_)[0]:.3f} ± {ci(re_)[1]:.3f};'
          f' raw-exec-episodes/raw-exec {ci(ee)[0]:.3f} ± {ci(ee)[1]:.3f}')
    for a in ['raw-exec', 'raw-exec-episodes', 'random']:
        ts = [p[k][a] for p in pairs]
        print(f'    {a:18s} busy {st.mean(busy(t) for t in ts):.2f} ms/step, idle {100*st.mean(t["idle_cpu_share"] for t in ts):.1f}%,'
              f' step {st.mean(t["step_ms"] for t in ts):.2f} ms, reset {st.mean(t["reset_ms_per_episode"] for t in ts):.2f} ms/episode,'
              f' {st.mean(t["steps"]/t["episodes"] for t in ts):.1f} steps/episode, engine {st.mean(t["engine_cpu_us_per_step"] for t in ts):.0f} us,'
              f' init {st.mean(t["init_cpu_us_per_step"] for t in ts):.0f} us')
