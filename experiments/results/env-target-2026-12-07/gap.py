#!/usr/bin/env python3
# gap.py ENGINE SOCKET: served one-shots (a daemon of this build on SOCKET) and bwrap, each
# 160 times back to back and 160 times 20 ms apart (4 rounds of 40, interleaved), medians of
# the wall time around subprocess.run. Does the daemon's refill of the last request slow the next?
import os, subprocess, time, statistics as st, sys
E, S = sys.argv[1], sys.argv[2]
env = dict(os.environ, ENVFACTORY_EXEC_SOCKET=S)
def one():
    t = time.perf_counter(); subprocess.run([E, 'sandbox', 'exec', '--', '/bin/true'], env=env, check=True); return time.perf_counter() - t
def bw():
    t = time.perf_counter(); subprocess.run(['bwrap', '--unshare-all', '--ro-bind', '/', '/', '--proc', '/proc', '--dev', '/dev', '/bin/true'], check=True); return time.perf_counter() - t
for _ in range(20): one()
res = {}
for rnd in range(4):
    for name, f, gap in (('served back-to-back', one, 0), ('served 20 ms apart', one, 0.02), ('bwrap back-to-back', bw, 0), ('bwrap 20 ms apart', bw, 0.02)):
        for _ in range(40):
            if gap: time.sleep(gap)
            res.setdefault(name, []).append(one() if f is one else bw())
for k, v in res.items():
    print(f'{k:22s} median {1e3*st.median(v):.2f} ms  n={len(v)}')
