#!/usr/bin/env python3
# Mean time of the raw-exec ceiling's fixed command by its position after a reset: the first,
# second and third command and the median of the rest, in µs, each with its excess over that
# median.
# - pos.txt: the POS lines of `EF_POS=1 EF_FIXED="tar --version | head -n 1" engine bench env
#   --workers 1,2 --seconds 8` on a build with measure.patch; the 1-worker row's 8 lines (4
#   rounds of the ceiling and of raw-exec-episodes) come first, then the 2-worker row's 16.
# - sleep0.txt, sleep20000.txt: 2 workers, the same with EF_SLEEP_US=0 or 20000 (a pause of the
#   worker after each reset; measure-sleep.patch).
# - warm-true.txt, warm-same.txt: 2 workers, EF_SLEEP_US=20000 and then one uncounted command
#   (EF_WARM: `true`, or the measured command itself; measure-warm.patch).
# One run each.
import os, statistics as st

here = os.path.dirname(os.path.abspath(__file__))


def show(label, rows):
    for every in ('everyNone', 'every13/14'):
        sel = [r for r in rows if (r[2] == 'everyNone') == (every == 'everyNone')]
        n = 30 if every == 'everyNone' else 13
        means = [st.mean(float(r[3 + i]) for r in sel) for i in range(n)]
        rest = st.median(means[3:])
        print(f'{label:25s} {every:11s} lines {len(sel):2d}  1st {means[0]:.0f}  2nd {means[1]:.0f}'
              f'  3rd {means[2]:.0f}  rest {rest:.0f}  1st-rest {means[0] - rest:+.0f}'
              f'  2nd-rest {means[1] - rest:+.0f}')


def lines(name):
    return [l.split() for l in open(os.path.join(here, name))]


pos = lines('pos.txt')
show('pos.txt, 1 worker', pos[:8])
show('pos.txt, 2 workers', pos[8:])
for name in ('sleep0.txt', 'sleep20000.txt', 'warm-true.txt', 'warm-same.txt'):
    show(f'{name}, 2 workers', lines(name))
