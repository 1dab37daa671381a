#!/usr/bin/env python3
# Mean time of the raw-exec ceiling's commands by their position after a reset, from pos.txt
# (`EF_POS=1 EF_FIXED="tar --version | head -n 1" engine bench env --workers 1,2 --seconds 8`
# on a build with measure.patch). Lines of the 1-worker row come first (8: 4 rounds of the
# ceiling and of raw-exec-episodes), then the 2-worker row (16, one per worker).
import os, statistics as st
lines = [l.split() for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'pos.txt'))]
for label, rows in (('1 worker', lines[:8]), ('2 workers', lines[8:])):
    for every in ('everyNone', 'every13/14'):
        sel = [r for r in rows if (r[2] == 'everyNone') == (every == 'everyNone')]
        n = 30 if every == 'everyNone' else 13
        means = [st.mean(float(r[3 + i]) for r in sel) for i in range(n)]
        later = st.median(means[3:])
        print(f'{label:9s} {every:11s} lines {len(sel):2d}  us: 1st {means[0]:.0f}  2nd {means[1]:.0f}  3rd {means[2]:.0f}  median of the rest {later:.0f}  1st-rest {means[0]-later:+.0f}  2nd-rest {means[1]-later:+.0f}')
