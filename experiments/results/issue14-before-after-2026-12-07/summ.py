#!/usr/bin/env python3
# summ.py: issue 14 before and after, from runs/ (run.sh). Per round: the one-shot medians
# (hyperfine) and their ratios to bwrap in the same series; `engine bench sandbox`'s
# create + first exec / bwrap and exec / host `sh -c true`; `engine bench env`'s random agent /
# raw-exec ceiling on 2 workers and its steps/s. Over the rounds: each figure's mean with its
# 95% t-interval (and each round's value), and after / before by round. Writes ratios.svg.
import glob, json, math, os, re, statistics as st
HERE = os.path.dirname(os.path.abspath(__file__))
R = f'{HERE}/runs'
TQ = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
      10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
def ci(xs):
    m = st.mean(xs)
    if len(xs) < 2:
        return m, float('nan')
    df = len(xs) - 1
    return m, TQ[max(k for k in TQ if k <= df)] * st.stdev(xs) / math.sqrt(len(xs))
def fmt(xs, d=3):
    m, h = ci(xs)
    return f'{m:.{d}f} ± {h:.{d}f} ({", ".join(f"{x:.{d}f}" for x in xs)})'
num = lambda f: int(re.findall(r'\d+', os.path.basename(f))[-1])
rounds = sorted(num(f) for f in glob.glob(f'{R}/oneshot-*.json'))
print(open(f'{R}/builds').read().strip())
print('("new" above: main c2e897e with the benchmark fix of 6e18195 uncommitted; "old" in section 4: c2e897e as committed)')
print(f'{len(rounds)} rounds\n')
BW = 'bwrap --unshare-all'
ROWS = ['base: engine sandbox exec', 'new: engine sandbox exec --no-daemon',
        "new: served, cargo build's front", 'new: served, static front', 'host sh -c true']
one = {k: [] for k in ROWS}
print('1. whole-process one-shot `engine sandbox exec -- /bin/true` (hyperfine, 60 runs each), medians in ms:')
for i in rounds:
    m = {r['command']: 1e3 * st.median(r['times']) for r in json.load(open(f'{R}/oneshot-{i}.json'))['results']}
    print(f'  round {i}: ' + ', '.join(f'{k} {m[k]:.2f}' for k in ROWS) + f', bwrap {m[BW]:.2f}')
    for k in ROWS:
        one[k].append(m[k] / m[BW])
print('  ratio to bwrap in the same hyperfine run (target for the one-shots: at most 1.0):')
for k in ROWS:
    print(f'    {k:40s} {fmt(one[k])}')
sb = {lab: {k: [] for k in ('create_vs_bwrap', 'exec_vs_host')} for lab in ('base', 'new')}
for i in rounds:
    for lab in ('base', 'new'):
        r = json.load(open(f'{R}/{lab}-sandbox-{i}.json'))['ratios']
        for k in sb[lab]:
            sb[lab][k].append(r[k])
print('\n2. engine bench sandbox --json (each build against bwrap / the host in its own run):')
for k, target in (('create_vs_bwrap', 'at most 0.5'), ('exec_vs_host', 'at most 1.15')):
    print(f'  {k} (target: {target}):')
    for lab in ('base', 'new'):
        print(f'    {lab:4s} {fmt(sb[lab][k])}')
def env2(f):
    rows = {t['agent']: t['steps_per_s'] for t in json.load(open(f))['throughput'] if t['workers'] == 2}
    return rows['random'], rows['raw-exec']
env = {lab: [env2(f'{R}/{lab}-env-{i}.json') for i in rounds] for lab in ('base', 'new')}
print('\n3. engine bench env --task archive-logs --workers 2 --seconds 8 --iterations 3:')
print('  random / raw-exec steps/s, 2 workers (target: at least 0.9):')
for lab in ('base', 'new'):
    print(f'    {lab:4s} {fmt([a / b for a, b in env[lab]])}')
for j, name in ((0, 'random agent'), (1, 'raw-exec ceiling')):
    print(f'  {name} steps/s: base {fmt([e[j] for e in env["base"]], 0)}; new {fmt([e[j] for e in env["new"]], 0)}')
    print(f'    new / base by round: {fmt([n[j] / b[j] for n, b in zip(env["new"], env["base"])])}')
# pause.sh: the same machine, main c2e897e's benchmark (bwrap alone timed after a pause) and
# this one's (each after the same pause), alternated.
pp = sorted({num(f) for f in glob.glob(f'{R}/pause-old-*.json')} & {num(f) for f in glob.glob(f'{R}/pause-fixed-*.json')})
if pp:
    print('\n4. engine bench sandbox, bwrap alone after a pause (old, main c2e897e) and each after the same pause (fixed):')
    for lab in ('old', 'fixed'):
        js = [json.load(open(f'{R}/pause-{lab}-{i}.json')) for i in pp]
        print(f'  {lab:5s} create / bwrap {fmt([j["ratios"]["create_vs_bwrap"] for j in js])}')
        client = 'the engine program' if lab == 'old' else "cargo build's front"
        print(f'        served one-shot / bwrap {fmt([j["ratios"]["one_shot_daemon_vs_bwrap"] for j in js])} (client: {client})')
        print(f'        medians (ms): create + first exec {fmt([j["create_first_exec"]["median"] for j in js], 2)}; '
              f'bwrap {fmt([j["bwrap_unshare_all"]["median"] for j in js], 2)}')
# pause-bwrap.sh: bwrap back to back and after a 25 ms pause (hyperfine medians).
pb = sorted(num(f) for f in glob.glob(f'{R}/pause-bwrap-b2b-*.json'))
if pb:
    med = lambda f: 1e3 * st.median(json.load(open(f))['results'][0]['times'])
    print('\n5. bwrap back to back and after a 25 ms pause (hyperfine, 60 runs each, medians in ms):')
    print(f'  back to back {fmt([med(f"{R}/pause-bwrap-b2b-{i}.json") for i in pb], 2)}')
    print(f'  after 25 ms  {fmt([med(f"{R}/pause-bwrap-paused-{i}.json") for i in pb], 2)}')
# The plot: each figure against its target, before and after; a dot per round, the mean and
# its interval.
cols = [('one-shot / bwrap', one['base: engine sandbox exec'], one['new: served, static front']),
        ("served, cargo's front", None, one["new: served, cargo build's front"]),
        ('--no-daemon', None, one['new: engine sandbox exec --no-daemon']),
        ('create / bwrap', sb['base']['create_vs_bwrap'], sb['new']['create_vs_bwrap']),
        ('exec / host sh', sb['base']['exec_vs_host'], sb['new']['exec_vs_host']),
        ('random / raw-exec', [a / b for a, b in env['base']], [a / b for a, b in env['new']])]
TARGETS = [1.0, 1.0, 1.0, 0.5, 1.15, 0.9]
W, H, L, B0 = 160 * len(cols) + 70, 390, 60, 60
lo, hi = 0.0, 5.5
y = lambda v: B0 + (math.log(hi + 0.5) - math.log(v + 0.5)) / (math.log(hi + 0.5) - math.log(lo + 0.5)) * (H - 2 * B0)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       '<rect width="100%" height="100%" fill="white"/>',
       f'<text x="{L}" y="16">issue 14 before (grey, main 718b372) and after (blue), same runs; red: each target</text>',
       f'<text x="{L}" y="30">dots: rounds; bar: mean and 95% interval; one-shot columns after: served by a daemon (static front,</text>',
       f'<text x="{L}" y="44">then cargo build\'s glibc front), then made by the process itself; log scale</text>']
for v in (0.25, 0.5, 0.75, 1.0, 1.5, 2, 3, 4, 5):
    svg.append(f'<line x1="{L}" x2="{W - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
               f'<text x="{L - 34}" y="{y(v) + 4:.1f}">{v:g}</text>')
for i, ((name, before, after), target) in enumerate(zip(cols, TARGETS)):
    cx = L + 70 + 160 * i
    svg.append(f'<line x1="{cx - 50}" x2="{cx + 70}" y1="{y(target):.1f}" y2="{y(target):.1f}" stroke="#c00" stroke-width="1.5"/>')
    for xs, off, colour in ((before, -25, '#888'), (after, 25, '#36c')):
        if not xs:
            continue
        for n, v in enumerate(xs):
            svg.append(f'<circle cx="{cx + off - 12 + 24 * n / max(1, len(xs) - 1):.1f}" cy="{y(v):.1f}" r="3" fill="{colour}" fill-opacity="0.6"/>')
        m, h = ci(xs)
        h = 0.0 if math.isnan(h) else h
        svg.append(f'<line x1="{cx + off + 18}" x2="{cx + off + 18}" y1="{y(m + h):.1f}" y2="{y(max(m - h, 0)):.1f}" stroke="{colour}" stroke-width="2"/>'
                   f'<line x1="{cx + off + 13}" x2="{cx + off + 23}" y1="{y(m):.1f}" y2="{y(m):.1f}" stroke="{colour}" stroke-width="2"/>')
    svg.append(f'<text x="{cx - 50}" y="{H - 14}">{name}</text>')
svg.append('</svg>')
open(f'{HERE}/ratios.svg', 'w').write('\n'.join(svg) + '\n')
