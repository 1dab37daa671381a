#!/usr/bin/env python3
# summ.py [RUNS]: the roots made ahead, from runs/ (ab.sh, env.sh) or RUNS. Per pair: `engine bench sandbox`'s medians
# and ratios of the base build (main e89166d) and of this one, each against bwrap timed in its
# own run. Over the pairs: each figure's mean with its 95% t-interval (and each pair's value),
# and new / base by pair. Writes ratios.svg.
import glob, json, math, os, re, statistics as st, sys
HERE = os.path.dirname(os.path.abspath(__file__))
R = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else f'{HERE}/runs'
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
pairs = sorted({num(f) for f in glob.glob(f'{R}/base-*.json')} & {num(f) for f in glob.glob(f'{R}/new-*.json')})
runs = {lab: [json.load(open(f'{R}/{lab}-{i}.json')) for i in pairs] for lab in ('base', 'new')}
print(f'{len(pairs)} alternated pairs of `engine bench sandbox --json` (50 iterations each)\n')
RATIOS = [('create_vs_bwrap', 'create + first exec (spare) / bwrap, target at most 0.5'),
          ('create_cloned_vs_bwrap', 'create + first exec (cloned init) / bwrap'),
          ('one_shot_daemon_vs_bwrap', "served one-shot (cargo build's front) / bwrap"),
          ('one_shot_vs_bwrap', 'no-daemon one-shot / bwrap'),
          ('exec_vs_host', 'exec sh -c true / host sh -c true')]
print('ratios, each of one run:')
for k, name in RATIOS:
    print(f'  {name}:')
    for lab in ('base', 'new'):
        print(f'    {lab:4s} {fmt([j["ratios"][k] for j in runs[lab]])}')
    print(f'    new / base by pair {fmt([n["ratios"][k] / b["ratios"][k] for n, b in zip(runs["new"], runs["base"])])}')
MS = ['create_first_exec', 'create_first_exec_cloned', 'bwrap_unshare_all', 'one_shot_daemon',
      'host_sh_true', 'exec_sh_true', 'reset_100_files', 'rollback', 'snapshot_100_files']
print('\nmedians (ms):')
for k in MS:
    print(f'  {k}:')
    for lab in ('base', 'new'):
        print(f'    {lab:4s} {fmt([j[k]["median"] for j in runs[lab]], 2)}')
    print(f'    new / base by pair {fmt([n[k]["median"] / b[k]["median"] for n, b in zip(runs["new"], runs["base"])])}')
print('\ncreates that got a spare init (of 50):', {lab: [j['create_from_spare'] for j in runs[lab]] for lab in runs})
# env.sh: the random agent and the raw-exec ceiling on 2 workers, alternated pairs.
ep = sorted({num(f) for f in glob.glob(f'{R}/env-base-*.json')} & {num(f) for f in glob.glob(f'{R}/env-new-*.json')})
if ep:
    def env2(f):
        rows = {t['agent']: t['steps_per_s'] for t in json.load(open(f))['throughput'] if t['workers'] == 2}
        return rows['random'], rows['raw-exec']
    env = {lab: [env2(f'{R}/env-{lab}-{i}.json') for i in ep] for lab in ('base', 'new')}
    print(f'\nenv: engine bench env --task archive-logs --workers 2 --seconds 8 --iterations 3, {len(ep)} pairs:')
    print('  random / raw-exec steps/s (target at least 0.9):')
    for lab in ('base', 'new'):
        print(f'    {lab:4s} {fmt([a / b for a, b in env[lab]])}')
    for j, name in ((0, 'random agent'), (1, 'raw-exec ceiling')):
        print(f'  {name} steps/s: base {fmt([e[j] for e in env["base"]], 0)}; new {fmt([e[j] for e in env["new"]], 0)}')
        print(f'    new / base by pair {fmt([n[j] / b[j] for n, b in zip(env["new"], env["base"])])}')
# The plot: create / bwrap and the served one-shot / bwrap, a dot per pair, mean and interval.
W, H, L, T, B = 560, 300, 60, 30, 50
items = [(k, lab) for k in ('create_vs_bwrap', 'one_shot_daemon_vs_bwrap') for lab in ('base', 'new')]
ymax = 1.2
y = lambda v: T + (H - T - B) * (1 - v / ymax)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="16" text-anchor="middle" font-size="13">ratio to bwrap in the same run ({len(pairs)} pairs; mean, 95% interval)</text>']
for v in (0, 0.25, 0.5, 0.75, 1.0):
    svg.append(f'<line x1="{L}" x2="{W-10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
    svg.append(f'<text x="{L-6}" y="{y(v)+4:.1f}" text-anchor="end">{v:.2f}</text>')
svg.append(f'<line x1="{L}" x2="{W-10}" y1="{y(0.5):.1f}" y2="{y(0.5):.1f}" stroke="#c33" stroke-dasharray="4 3"/>')
svg.append(f'<text x="{W-12}" y="{y(0.5)-4:.1f}" text-anchor="end" fill="#c33">create target 0.5</text>')
svg.append(f'<line x1="{L}" x2="{W-10}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" stroke="#36c" stroke-dasharray="4 3"/>')
svg.append(f'<text x="{W-12}" y="{y(1.0)-4:.1f}" text-anchor="end" fill="#36c">one-shot target 1.0</text>')
step = (W - L - 20) / len(items)
for n, (k, lab) in enumerate(items):
    xs = [j['ratios'][k] for j in runs[lab]]
    m, h = ci(xs)
    cx = L + step * (n + 0.5)
    col = '#888' if lab == 'base' else '#2a7'
    for v in xs:
        svg.append(f'<circle cx="{cx:.1f}" cy="{y(v):.1f}" r="2.5" fill="{col}" opacity="0.6"/>')
    svg.append(f'<line x1="{cx+10:.1f}" x2="{cx+10:.1f}" y1="{y(m-h):.1f}" y2="{y(m+h):.1f}" stroke="black"/>')
    svg.append(f'<circle cx="{cx+10:.1f}" cy="{y(m):.1f}" r="3.5" fill="black"/>')
    name = 'create + first exec' if k == 'create_vs_bwrap' else 'served one-shot'
    svg.append(f'<text x="{cx:.1f}" y="{H-B+16}" text-anchor="middle">{name}</text>')
    svg.append(f'<text x="{cx:.1f}" y="{H-B+30}" text-anchor="middle">{lab}</text>')
svg.append('</svg>')
if R == f'{HERE}/runs':
    open(f'{HERE}/ratios.svg', 'w').write('\n'.join(svg))
