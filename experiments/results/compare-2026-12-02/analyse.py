import json, math, statistics as st
# Student-t 0.975 quantiles for small n-1
T = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447}
def ci(xs):
    n = len(xs); m = sum(xs)/n
    if n < 2: return m, float('nan')
    return m, T[n-1]*st.stdev(xs)/math.sqrt(n)
rows = {}
for m in ['clean', 'dr', 'rarl']:
    j = json.load(open(f'experiments/results/compare-2026-12-02/{m}/report.json'))
    rows[m] = j
print('| method | seeds | held-out clean | held-out faulted | held-out families (tool-shadowed, disk-fill) | catalogue oracle, faulted | steps/s |')
print('|---|---|---|---|---|---|---|')
for m, j in rows.items():
    f = lambda k: '%.3f ± %.3f' % ci(j[k]['per_seed'])
    print(f"| {m} | {len(j['seeds']) if isinstance(j['seeds'], list) else j['seeds']} | {f('held_out_clean')} | {f('held_out_faulted')} | {f('held_out_families')} | {f('held_out_faulted_oracle')} | {'%.1f' % j['steps_per_s']['mean'] if isinstance(j['steps_per_s'], dict) else j['steps_per_s']} |")
print()
print('per seed, faulted:')
for m, j in rows.items(): print(m, j['held_out_faulted']['per_seed'], 'families', j['held_out_families']['per_seed'])
print()
base = rows['clean']['held_out_faulted']['per_seed']
for m in ['dr', 'rarl']:
    d = [a - b for a, b in zip(rows[m]['held_out_faulted']['per_seed'], base)]
    print('%s - clean, faulted, paired by seed: %.3f ± %.3f' % ((m,) + ci(d)))
d = [a - b for a, b in zip(rows['rarl']['held_out_faulted']['per_seed'], rows['dr']['held_out_faulted']['per_seed'])]
print('rarl - dr, faulted, paired by seed: %.3f ± %.3f' % ci(d))
