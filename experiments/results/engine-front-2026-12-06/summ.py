#!/usr/bin/env python3
"""Every figure of README.md from the files here: python3 summ.py"""
import glob, json, math, os, re, statistics as st

here = os.path.dirname(os.path.abspath(__file__))
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120}


def interval(v):
    """Mean and half-width of the 95% t-interval."""
    m = st.mean(v)
    if len(v) < 2:
        return m, float('nan')
    df = len(v) - 1
    t = T95.get(df) or T95[max(k for k in T95 if k <= df)] if df <= 16 else 1.96
    return m, t * st.stdev(v) / math.sqrt(len(v))


def geo(v):
    """Geometric mean of ratios and its 95% interval (t-interval of the logs)."""
    m, h = interval([math.log(x) for x in v])
    return '%.3f [%.3f, %.3f] (n=%d, range %.3f-%.3f)' % (
        math.exp(m), math.exp(m - h), math.exp(m + h), len(v), min(v), max(v))


def median_ms(results, name):
    return st.median(next(r for r in results if r['command'] == name)['times']) * 1000


def cpu(path):
    """wall and busy CPU, us per run, from cpu.sh's line."""
    w, b = re.findall(r'(\d+) us/run', open(path).read())
    return int(w), int(b)


for d in sorted(p for p in glob.glob(os.path.join(here, 'ab*')) if os.path.isdir(p)):
    print('## %s (ab.sh): medians per round, ms' % os.path.basename(d))
    names = ['served-engine', 'served-engine-core', 'bwrap', 'own-engine', 'own-engine-core']
    rows = []
    for f in sorted(glob.glob(os.path.join(d, 'round-*.json')),
                    key=lambda p: int(p.rsplit('-', 1)[1][:-5])):
        res = json.load(open(f))['results']
        row = [median_ms(res, n) for n in names]
        rows.append(row)
        print('  ' + os.path.basename(f) + ': ' + ', '.join('%s %.3f' % (n, x) for n, x in zip(names, row)))
    if not rows:
        continue
    print('  served, front / engine program: ' + geo([r[0] / r[1] for r in rows]))
    print('  served, front / bwrap:          ' + geo([r[0] / r[2] for r in rows]))
    print('  served, engine program / bwrap: ' + geo([r[1] / r[2] for r in rows]))
    print('  --no-daemon, front / engine program: ' + geo([r[3] / r[4] for r in rows]))
    print('  --no-daemon, front / bwrap: ' + geo([r[3] / r[2] for r in rows]))
    diffs, walls, bw = [], [], []
    for f in glob.glob(os.path.join(d, 'cpu-*-engine.txt')):
        r = f.rsplit('-', 2)[1]
        a, b = cpu(f), cpu(os.path.join(d, 'cpu-%s-engine-core.txt' % r))
        diffs.append(a[1] - b[1])
        walls.append(a[0] - b[0])
        bw.append(cpu(os.path.join(d, 'cpu-%s-bwrap.txt' % r))[1])
    if diffs:
        m, h = interval(diffs)
        print('  busy CPU per served one-shot, whole machine, front - engine program: %.0f ± %.0f us (n=%d)' % (m, h, len(diffs)))
        m, h = interval(walls)
        print('  wall per served one-shot back to back (cpu.sh), front - engine program: %.0f ± %.0f us' % (m, h))
        print('  busy CPU per bwrap run: median %d us' % st.median(bw))

cmp = []
for f in sorted(glob.glob(os.path.join(here, 'compare', '*.json'))):
    res = json.load(open(f))['results']
    s, w = median_ms(res, 'engine sandbox exec (daemon)'), median_ms(res, 'bwrap --unshare-all')
    o = median_ms(res, 'engine sandbox exec')
    cmp.append(s / w)
    print('compare %s: served %.3f ms, bwrap %.3f ms, served / bwrap %.3f; own %.3f ms, own / bwrap %.3f' % (
        os.path.basename(f), s, w, s / w, o, o / w))
if cmp:
    print('compare.sh, served / bwrap: median %.3f, %.3f-%.3f; at most 1.0 in %d of %d' % (
        st.median(cmp), min(cmp), max(cmp), sum(r <= 1.0 for r in cmp), len(cmp)))

def describe(v):
    m, h = interval(v)
    return 'median %.3f, range %.3f-%.3f, mean %.3f ± %.3f (n=%d)' % (
        st.median(v), min(v), max(v), m, h, len(v))


print('## engine bench sandbox --json, alternated pairs: base (ef0080b) and new (the front)')
keys = ['one_shot_daemon_vs_bwrap', 'one_shot_vs_bwrap', 'create_vs_bwrap', 'exec_vs_host']
runs = {}
for f in glob.glob(os.path.join(here, 'bench-sandbox', '*.json')):
    i, b = os.path.basename(f)[:-5].split('-')
    runs.setdefault(int(i), {})[b] = json.load(open(f))
pairs = [runs[i] for i in sorted(runs) if len(runs[i]) == 2]
for k in keys:
    for b in ('base', 'new'):
        print('  %-4s %-26s %s' % (b, k, describe([p[b]['ratios'][k] for p in pairs])))
    print('  paired new / base %-15s %s' % (k, geo([p['new']['ratios'][k] / p['base']['ratios'][k] for p in pairs])))
for k in ('one_shot_daemon', 'one_shot_exec', 'bwrap_unshare_all'):
    for b in ('base', 'new'):
        v = [p[b][k]['median'] for p in pairs if isinstance(p[b].get(k), dict)]
        if v:
            print('  %-4s %-26s median of medians %.3f ms' % (b, k, st.median(v)))

envs = sorted(glob.glob(os.path.join(here, 'env', '*.json')))
if envs:
    print('## engine bench env --task archive-logs --workers 2 --seconds 8 --iterations 5 (engine-core, 5c8e561)')
    for f in envs:
        d = json.load(open(f))
        r = d['random_vs_raw'][0]
        print('  %s: random / raw-exec %.3f (rounds %s), random / raw-exec-episodes %.3f' % (
            os.path.basename(f), r['ratio'], ', '.join('%.3f' % x for x in r['per_round']),
            d['random_vs_raw_episodes'][0]['ratio']))
