#!/usr/bin/env python3
# summ.py [--history]: the 2-worker random / raw-exec ratio of every run in runs/ (form A: A-N.json,
# `--workers 2`; form B: B-N.json, `--workers 1,2,3`), per form: mean with its 95% t-interval
# over the runs, median, runs below 0.9; the difference B - A (Welch); random /
# raw-exec-episodes and raw-exec-episodes / raw-exec likewise. With --history, the same for
# the earlier stops' runs of each form (../env-reset-2026-12-07, ../env-idle-2026-12-07), kept
# apart from this stop's, and writes ratios.svg: each run's ratio, by set, the 0.9 target drawn.
import glob, json, math, os, re, statistics as st, sys
HERE = os.path.dirname(os.path.abspath(__file__))
# 97.5% quantiles of Student's t (two-sided 95%) by degrees of freedom, linear between entries.
TQ = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
      10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000}
def tq(df):
    ks = sorted(TQ)
    if df >= ks[-1]:
        return 1.96 if df > 120 else TQ[ks[-1]]
    lo = max(k for k in ks if k <= df); hi = min(k for k in ks if k >= df)
    return TQ[lo] if lo == hi else TQ[lo] + (TQ[hi] - TQ[lo]) * (df - lo) / (hi - lo)
def ci(xs):
    m = st.mean(xs)
    return m, (tq(len(xs) - 1) * st.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float('nan'))
def welch(a, b):
    va, vb = st.variance(a) / len(a), st.variance(b) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    d = st.mean(b) - st.mean(a)
    return d, tq(df) * math.sqrt(va + vb)
def two(f):
    j = json.load(open(f))
    rows = {t['agent']: t for t in j['throughput'] if t['workers'] == 2}
    return (rows['random']['steps_per_s'] / rows['raw-exec']['steps_per_s'],
            rows['random']['steps_per_s'] / rows['raw-exec-episodes']['steps_per_s'],
            rows['raw-exec-episodes']['steps_per_s'] / rows['raw-exec']['steps_per_s'],
            rows['random']['steps_per_s'], rows['raw-exec']['steps_per_s'])
def num(f):
    return int(re.findall(r'\d+', os.path.basename(f))[-1])
def done(f):
    try:
        return two(f)
    except (ValueError, KeyError):  # a run still being written
        return None
def show(label, files):
    runs = [r for r in map(done, files) if r]
    if not runs:
        return []
    r = [x[0] for x in runs]
    m, h = ci(r)
    print(f'{label}: {len(r)} runs; random/raw-exec {m:.3f} ± {h:.3f} (median {st.median(r):.3f},'
          f' {sum(x < 0.9 for x in r)} below 0.9): {", ".join(f"{x:.3f}" for x in r)}')
    for k, name in ((1, 'random/raw-exec-episodes'), (2, 'raw-exec-episodes/raw-exec')):
        m, h = ci([x[k] for x in runs])
        print(f'    {name} {m:.3f} ± {h:.3f}')
    print(f'    steps/s: random {st.mean(x[3] for x in runs):.0f}, raw-exec {st.mean(x[4] for x in runs):.0f}')
    return r
by_form = {}
for form in 'AB':
    by_form[form] = show(f'this stop, runs/, form {form}', sorted(glob.glob(f'{HERE}/runs/{form}-*.json'), key=num))
if by_form['A'] and len(by_form['B']) > 1 and len(by_form['A']) > 1:
    d, h = welch(by_form['A'], by_form['B'])
    print(f'form B - form A: {d:+.3f} ± {h:.3f} (Welch, 95%)')
every = by_form['A'] + by_form['B']
if len(every) > 1:
    m, h = ci(every)
    print(f'both forms together: {len(every)} runs, {m:.3f} ± {h:.3f}, median {st.median(every):.3f},'
          f' {sum(x < 0.9 for x in every)} below 0.9')
hist = {}
if '--history' in sys.argv:
    R = os.path.dirname(HERE)
    hist['A'] = show('earlier, form A (env-reset ab-*, base and new)',
                     sorted(glob.glob(f'{R}/env-reset-2026-12-07/ab-*/*.json')))
    hist['B'] = show('earlier, form B (env-idle runs/ and after/, env-reset runs/)',
                     sorted(glob.glob(f'{R}/env-idle-2026-12-07/runs/*.json')
                            + glob.glob(f'{R}/env-idle-2026-12-07/after/*.json')
                            + glob.glob(f'{R}/env-reset-2026-12-07/runs/*.json')))
# The plot (with --history): one column per set, a dot per run, the mean and its interval.
ab = {lab: [r[0] for r in map(done, sorted(glob.glob(f'{HERE}/ab/{lab}*.json'), key=num)) if r]
      for lab in ('base', 'new')}
sets = [('runs/ A', by_form['A']), ('runs/ B', by_form['B']), ('ab/ base A', ab['base']),
        ('ab/ new A', ab['new'])]
sets += [(f'earlier {f}', hist[f]) for f in 'AB' if hist.get(f)]
sets = [(n, xs) for n, xs in sets if xs] if hist else []
W, H, L, B0 = max(120 * len(sets) + 80, 620), 360, 60, 40
lo, hi = 0.80, 1.00
y = lambda v: B0 + (hi - v) / (hi - lo) * (H - 2 * B0)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<text x="{L}" y="16">random / raw-exec steps/s, 2 workers (archive-logs)</text>',
       f'<text x="{L}" y="30">dots: runs; bar: mean and 95% interval; red: the 0.9 target</text>']
for v in (0.80, 0.85, 0.90, 0.95, 1.00):
    svg.append(f'<line x1="{L}" x2="{W - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="{"#c00" if v == 0.90 else "#ddd"}"/>'
               f'<text x="{L - 30}" y="{y(v) + 4:.1f}">{v:.2f}</text>')
for i, (name, xs) in enumerate(sets):
    cx = L + 60 + 120 * i
    for k, v in enumerate(xs):
        svg.append(f'<circle cx="{cx - 20 + 40 * k / max(1, len(xs) - 1):.1f}" cy="{y(min(max(v, lo), hi)):.1f}" r="3" fill="#36c" fill-opacity="0.6"/>')
    m, h = ci(xs) if len(xs) > 1 else (xs[0], 0.0)
    svg.append(f'<line x1="{cx + 30}" x2="{cx + 30}" y1="{y(m + h):.1f}" y2="{y(m - h):.1f}" stroke="#000" stroke-width="2"/>'
               f'<line x1="{cx + 24}" x2="{cx + 36}" y1="{y(m):.1f}" y2="{y(m):.1f}" stroke="#000" stroke-width="2"/>'
               f'<text x="{cx - 40}" y="{H - 12}">{name} ({len(xs)})</text>')
svg.append('</svg>')
if sets:
    open(f'{HERE}/ratios.svg', 'w').write('\n'.join(svg) + '\n')
# The other targets, from this stop's runs of both builds (base: main 3bcc4e0, new:
# this stop's build): benches/compare.sh 60 (compare/: baseN and newN alternated, new-soloN
# six runs of the new build before them), engine bench sandbox --json (bench-sandbox/: six
# alternated pairs).
def medians(f):
    return {r['command']: r['median'] for r in json.load(open(f))['results']}
print('benches/compare.sh 60, served one-shot / bwrap (ratio of medians):')
for lab, pat in (('base', 'base*.json'), ('new', 'new[0-9]*.json'), ('new, solo', 'new-solo*.json')):
    xs = [m['engine sandbox exec (daemon)'] / m['bwrap --unshare-all']
          for m in map(medians, sorted(glob.glob(f'{HERE}/compare/{pat}'), key=num))]
    if xs:
        print(f'    {lab}: {", ".join(f"{x:.3f}" for x in xs)}; median {st.median(xs):.3f},'
              f' at most 1.0 in {sum(x <= 1.0 for x in xs)} of {len(xs)}')
print('engine bench sandbox --json, ratios (mean ± 95% interval, median):')
for k in ('create_vs_bwrap', 'one_shot_daemon_vs_bwrap', 'one_shot_vs_bwrap', 'exec_vs_host'):
    for lab in ('base', 'new'):
        xs = [json.load(open(f))['ratios'][k] for f in sorted(glob.glob(f'{HERE}/bench-sandbox/{lab}*.json'))]
        if len(xs) > 1:
            m, h = ci(xs)
            print(f'    {k:26s} {lab}: {m:.3f} ± {h:.3f}, median {st.median(xs):.3f}')
pairs = [(medians(f'{HERE}/compare/base{i}.json'), medians(f'{HERE}/compare/new{i}.json')) for i in range(1, 10)
         if os.path.exists(f'{HERE}/compare/base{i}.json') and os.path.exists(f'{HERE}/compare/new{i}.json')]
if len(pairs) > 1:
    logs = [math.log(n['engine sandbox exec (daemon)'] / b['engine sandbox exec (daemon)']) for b, n in pairs]
    m, h = ci(logs)
    print(f'    served one-shot median, paired new / base: {math.exp(m):.3f} [{math.exp(m - h):.3f}, {math.exp(m + h):.3f}]'
          f' ({len(pairs)} alternated runs)')
