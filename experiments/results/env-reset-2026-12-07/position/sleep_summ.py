#!/usr/bin/env python3
# The ceiling's fixed command by position after a reset, 2 workers, with the engine thread
# sleeping EF_SLEEP_US after each reset (0 or 20000), from sleep0.txt and sleep20000.txt (the
# POS lines of `EF_POS=1 EF_SLEEP_US=N EF_FIXED="tar --version | head -n 1" engine bench env
# --workers 2 --seconds 8` on a build with measure-sleep.patch); warm-true.txt and
# warm-same.txt: the same with EF_SLEEP_US=20000 and, after the pause, one uncounted command
# (EF_WARM: `true`, or the measured command itself) on a build with measure-warm.patch. One
# run each.
import os, statistics as st
here = os.path.dirname(os.path.abspath(__file__))
for f in ('sleep0.txt', 'sleep20000.txt', 'warm-true.txt', 'warm-same.txt'):
    rows = [l.split() for l in open(os.path.join(here, f))]
    for every in ('everyNone', 'every13/14'):
        sel = [r for r in rows if (r[2] == 'everyNone') == (every == 'everyNone')]
        n = 30 if every == 'everyNone' else 13
        means = [st.mean(float(r[3 + i]) for r in sel) for i in range(n)]
        later = st.median(means[3:])
        print(f'{f:15s} {every:11s} us: 1st {means[0]:.0f}  2nd {means[1]:.0f}  rest {later:.0f}'
              f'  1st-rest {means[0] - later:+.0f}  2nd-rest {means[1] - later:+.0f}')
