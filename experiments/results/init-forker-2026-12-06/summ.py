#!/usr/bin/env python3
"""Every figure of README.md from the files here: python3 summ.py"""
import glob, json, math, os, statistics as st

here = os.path.dirname(os.path.abspath(__file__))
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
       17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}


def t95(df):
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


def interval(v):
    """Mean and half-width of the 95% t-interval."""
    m = st.mean(v)
    if len(v) < 2:
        return m, float('nan')
    return m, t95(len(v) - 1) * st.stdev(v) / math.sqrt(len(v))


def median_ms(results, name):
    return st.median(next(r for r in results if r['command'] == name)['times']) * 1000


def describe(v, fmt='%.3f'):
    v = list(v)
    m, h = interval(v)
    return ('median ' + fmt + ', range ' + fmt + '-' + fmt + ', mean ' + fmt + ' ± ' + fmt + ' (n=%d)') % (
        st.median(v), min(v), max(v), m, h, len(v))


print('## benches/compare.sh 60, one build after the other (back to back in hyperfine)')
ratios = {'base': [], 'new': []}
for f in sorted(glob.glob(os.path.join(here, 'compare', '*.json')),
                key=lambda p: (int(p.rsplit('-', 1)[1].split('.')[0]), p)):
    b, r = os.path.basename(f)[:-5].split('-')
    res = json.load(open(f))['results']
    s, w = median_ms(res, 'engine sandbox exec (daemon)'), median_ms(res, 'bwrap --unshare-all')
    ratios[b].append(s / w)
    print('pair %s %-4s served %.3f ms, bwrap %.3f ms: %.3f' % (r, b, s, w, s / w))
for b in ('base', 'new'):
    print('served / bwrap, %s: %s; at most 1.0 in %d of %d' % (
        b, describe(ratios[b]), sum(x <= 1.0 for x in ratios[b]), len(ratios[b])))

print('\n## served one-shots of both builds in one hyperfine run per round (served.sh)')
for d in sorted(p for p in glob.glob(os.path.join(here, 'served*')) if os.path.isdir(p)):
    rows = []
    for f in sorted(glob.glob(os.path.join(d, 'round-*.json')),
                    key=lambda p: int(p.rsplit('-', 1)[1].split('.')[0])):
        res = json.load(open(f))['results']
        rows.append((median_ms(res, 'served-base'), median_ms(res, 'served-new')))
    nb = [n / b for b, n in rows]
    logs = [math.log(x) for x in nb]
    m, h = interval(logs)
    print('%s: new / base %s; new faster in %d of %d; geometric mean %.3f [%.3f, %.3f]' % (
        os.path.basename(d), describe(nb), sum(x < 1 for x in nb), len(nb),
        math.exp(m), math.exp(m - h), math.exp(m + h)))
    busy = {}
    for f in glob.glob(os.path.join(d, 'cpu-*.txt')):
        _, r, b = os.path.basename(f)[:-4].split('-')
        words = open(f).read().split()
        busy[(int(r), b)] = (int(words[1]), int(words[4]))
    pairs = [(busy[(r, 'base')], busy[(r, 'new')]) for r in sorted({k[0] for k in busy})
             if (r, 'base') in busy and (r, 'new') in busy]
    if pairs:
        print('   busy CPU per served run (whole machine, /proc/stat), new - base, us: %s' % describe(
            [n[1] - b[1] for b, n in pairs], '%.0f'))
        print('   base %s' % describe([b[1] for b, _ in pairs], '%.0f'))
        print('   new  %s' % describe([n[1] for _, n in pairs], '%.0f'))

print('\n## engine bench sandbox --iterations 50 --json, alternated pairs')
keys = [('exec_vs_host', 'ratios'), ('create_vs_bwrap', 'ratios'), ('one_shot_daemon_vs_bwrap', 'ratios'),
        ('one_shot_vs_bwrap', 'ratios'), ('exec_sh_true', None), ('idle_rss_kib', None),
        ('idle_pss_kib', None), ('idle_private_kib', None)]
for b in ('base', 'new'):
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(here, 'bench-sandbox', '*-%s.json' % b)))]
    for k, where in keys:
        v = [r['ratios'][k] if where else r[k]['median'] for r in runs]
        print('%-4s %-26s %s' % (b, k, describe(v)))

pairs = []
for f in sorted(glob.glob(os.path.join(here, 'bench-sandbox', '*-base.json'))):
    n = f.replace('-base.json', '-new.json')
    if os.path.exists(n):
        pairs.append(json.load(open(n))['ratios']['exec_vs_host'] - json.load(open(f))['ratios']['exec_vs_host'])
print('exec_vs_host, paired new - base: %s' % describe(pairs))

print('\n## engine bench env --task archive-logs --workers 2 --seconds 8 --iterations 5, alternated pairs')
for b in ('base', 'new'):
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(here, 'env', '*-%s.json' % b)))]
    for k in ('random_vs_raw', 'random_vs_raw_episodes'):
        print('%-4s %-24s %s' % (b, k, ', '.join('%.3f' % r[k][0]['ratio'] for r in runs)))
