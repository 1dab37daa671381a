#!/usr/bin/env python3
# summ.py: from runs/ (run.sh), per round the medians of each command and the ratios
# static front / bwrap, glibc front / bwrap and static / glibc front, for benches/compare.sh
# (hyperfine back to back) and for loop.py (plain loop, rotated blocks); over the rounds each
# ratio's mean with its 95% t-interval, its median, and in how many rounds it was at most 1.0;
# loop.py's busy CPU per run. Writes ratios.svg (each round's ratios, the 1.0 target drawn).
import glob, json, math, os, re, statistics as st
HERE = os.path.dirname(os.path.abspath(__file__))
TQ = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
      10: 2.228, 11: 2.201, 12: 2.179, 15: 2.131, 20: 2.086}
def ci(xs):
    m = st.mean(xs)
    if len(xs) < 2:
        return m, float('nan')
    df = len(xs) - 1
    t = TQ.get(df) or TQ[max(k for k in TQ if k <= df)]
    return m, t * st.stdev(xs) / math.sqrt(len(xs))
num = lambda f: int(re.findall(r'\d+', os.path.basename(f))[-1])
G, S, B = 'engine sandbox exec (daemon)', 'engine sandbox exec (daemon, static front)', 'bwrap --unshare-all'
LG, LS, LB = 'glibc front (daemon)', 'static front (daemon)', 'bwrap --unshare-all'
series = {}
def add(k, v):
    series.setdefault(k, []).append(v)
print('benches/compare.sh 60 (hyperfine, back to back), medians in ms:')
for f in sorted(glob.glob(f'{HERE}/runs/compare-*.json'), key=num):
    m = {r['command']: 1e3 * st.median(r['times']) for r in json.load(open(f))['results']}
    print(f'  round {num(f)}: static {m[S]:.2f}, glibc {m[G]:.2f}, bwrap {m[B]:.2f}, own sandbox '
          f'{m["engine sandbox exec"]:.2f}, host sh {m["host sh -c true"]:.2f}')
    add('compare: static / bwrap', m[S] / m[B]); add('compare: glibc / bwrap', m[G] / m[B])
    add('compare: static / glibc', m[S] / m[G])
print('loop.py (plain loop, 200 runs of each, rotated blocks of 50), medians in ms and busy CPU per run:')
for f in sorted(glob.glob(f'{HERE}/runs/loop-*.json'), key=num):
    j = json.load(open(f))
    m = {k: st.median(v) for k, v in j['wall_ms'].items()}
    c = j['busy_cpu_ms_per_run']
    print(f'  round {num(f)}: static {m[LS]:.2f} ({c[LS]:.2f} CPU), glibc {m[LG]:.2f} ({c[LG]:.2f}),'
          f' bwrap {m[LB]:.2f} ({c[LB]:.2f})')
    add('loop: static / bwrap', m[LS] / m[LB]); add('loop: glibc / bwrap', m[LG] / m[LB])
    add('loop: static / glibc', m[LS] / m[LG])
    add('loop CPU: static / bwrap', c[LS] / c[LB]); add('loop CPU: glibc / bwrap', c[LG] / c[LB])
print('ratios of medians over the rounds: mean ± 95% interval, median, rounds at most 1.0:')
for k, xs in series.items():
    m, h = ci(xs)
    print(f'  {k:26s} {m:.3f} ± {h:.3f}, median {st.median(xs):.3f}, <= 1.0 in {sum(x <= 1.0 for x in xs)}'
          f' of {len(xs)}: {", ".join(f"{x:.3f}" for x in xs)}')
# The fronts' own start (`engine __front-build`, hyperfine 300 runs) and engine bench sandbox
# --json run from target/release (glibc front) and target/static (static front), alternated.
print('front start alone, `engine __front-build` (medians, ms):')
for f in sorted(glob.glob(f'{HERE}/runs/front-start-*.json'), key=num):
    m = {r['command'].split('/')[1]: 1e3 * st.median(r['times']) for r in json.load(open(f))['results']}
    print(f'  run {num(f)}: static {m["static"]:.3f}, glibc {m["release"]:.3f} ({m["static"] / m["release"]:.2f})')
print('engine bench sandbox --json, ratios (mean ± 95% interval over the runs):')
for k in ('one_shot_daemon_vs_bwrap', 'one_shot_vs_bwrap', 'create_vs_bwrap', 'exec_vs_host'):
    for lab in ('glibc', 'static'):
        xs = [json.load(open(f))['ratios'][k] for f in sorted(glob.glob(f'{HERE}/bench-sandbox/{lab}-*.json'))]
        if xs:
            m, h = ci(xs)
            print(f'  {k:26s} {lab:6s} front: {m:.3f} ± {h:.3f} ({", ".join(f"{x:.3f}" for x in xs)})')
# ab.sh: the base build (main before this change) and this one, alternated: the env target
# (random / raw-exec steps/s on 2 workers), the random agent's steps/s new / base by pair, and
# the sandbox figures.
def env2(f):
    rows = {t['agent']: t['steps_per_s'] for t in json.load(open(f))['throughput'] if t['workers'] == 2}
    return rows['random'] / rows['raw-exec'], rows['random']
pairs = sorted({num(f) for f in glob.glob(f'{HERE}/ab/base-[0-9]*.json')} &
               {num(f) for f in glob.glob(f'{HERE}/ab/new-[0-9]*.json')})
if pairs:
    print('ab.sh, base (main c8045ec) and new, alternated pairs:')
    for lab in ('base', 'new'):
        xs = [env2(f'{HERE}/ab/{lab}-{i}.json')[0] for i in pairs]
        m, h = ci(xs)
        print(f'  env random / raw-exec, 2 workers, {lab}: {m:.3f} ± {h:.3f} ({", ".join(f"{x:.3f}" for x in xs)})')
    d = [env2(f'{HERE}/ab/new-{i}.json')[1] / env2(f'{HERE}/ab/base-{i}.json')[1] for i in pairs]
    m, h = ci(d)
    print(f'  random agent steps/s, new / base by pair: {m:.3f} ± {h:.3f}')
    for k in ('create_vs_bwrap', 'exec_vs_host', 'one_shot_daemon_vs_bwrap', 'one_shot_vs_bwrap'):
        for lab in ('base', 'new'):
            xs = [json.load(open(f'{HERE}/ab/{lab}-sandbox-{i}.json'))['ratios'][k] for i in pairs]
            m, h = ci(xs)
            print(f'  sandbox {k:26s} {lab}: {m:.3f} ± {h:.3f}')
# The plot: a column per wall-time ratio to bwrap, a dot per round, the mean and its interval.
cols = [k for k in ('compare: static / bwrap', 'compare: glibc / bwrap', 'loop: static / bwrap',
                    'loop: glibc / bwrap') if k in series]
W, H, L, B0, lo, hi = 170 * len(cols) + 90, 360, 60, 40, 0.6, 1.2
y = lambda v: B0 + (hi - v) / (hi - lo) * (H - 2 * B0)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       '<rect width="100%" height="100%" fill="white"/>',
       f'<text x="{L}" y="16">served one-shot / bwrap, medians per round (engine sandbox exec -- /bin/true)</text>',
       f'<text x="{L}" y="30">dots: rounds; bar: mean and 95% interval; red: the 1.0 target</text>']
for v in (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2):
    svg.append(f'<line x1="{L}" x2="{W - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="{"#c00" if v == 1.0 else "#ddd"}"/>'
               f'<text x="{L - 30}" y="{y(v) + 4:.1f}">{v:.1f}</text>')
for i, k in enumerate(cols):
    xs, cx = series[k], L + 80 + 170 * i
    for n, v in enumerate(xs):
        svg.append(f'<circle cx="{cx - 20 + 40 * n / max(1, len(xs) - 1):.1f}" cy="{y(min(max(v, lo), hi)):.1f}" r="3" fill="#36c" fill-opacity="0.6"/>')
    m, h = ci(xs)
    h = 0.0 if math.isnan(h) else h
    svg.append(f'<line x1="{cx + 30}" x2="{cx + 30}" y1="{y(m + h):.1f}" y2="{y(m - h):.1f}" stroke="#000" stroke-width="2"/>'
               f'<line x1="{cx + 24}" x2="{cx + 36}" y1="{y(m):.1f}" y2="{y(m):.1f}" stroke="#000" stroke-width="2"/>'
               f'<text x="{cx - 60}" y="{H - 12}">{k} ({len(xs)})</text>')
svg.append('</svg>')
if cols:
    open(f'{HERE}/ratios.svg', 'w').write('\n'.join(svg) + '\n')
