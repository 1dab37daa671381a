#!/usr/bin/env python3
# loop.py GLIBC_FRONT STATIC_FRONT: starts `GLIBC_FRONT sandbox daemon` on a socket of its own,
# then times `engine sandbox exec -- /bin/true` asked by each front and bwrap's equivalent,
# 4 blocks of 50 runs of each, rotated, each run timed around subprocess.run; prints JSON with
# every run's wall time (ms) and each command's busy CPU of the whole machine per run (ms,
# /proc/stat around each block: the daemon's refill and teardown, the kernel's cleanup).
import json, os, subprocess, sys, tempfile, time
glibc, static = sys.argv[1], sys.argv[2]
tick = os.sysconf('SC_CLK_TCK')
def busy():
    f = [int(x) for x in open('/proc/stat').readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / tick  # all but idle and iowait
d = tempfile.mkdtemp(prefix='envfactory-loop-')
sock = os.path.join(d, 'exec.sock')
daemon = subprocess.Popen([glibc, 'sandbox', 'daemon', '--socket', sock],
                          stderr=open(os.path.join(d, 'daemon.log'), 'w'))
env = dict(os.environ, ENVFACTORY_EXEC_SOCKET=sock)
cmds = {
    'glibc front (daemon)': [glibc, 'sandbox', 'exec', '--', '/bin/true'],
    'static front (daemon)': [static, 'sandbox', 'exec', '--', '/bin/true'],
    'bwrap --unshare-all': ['bwrap', '--unshare-all', '--ro-bind', '/', '/', '--proc', '/proc',
                            '--dev', '/dev', '/bin/true'],
}
try:
    for _ in range(300):
        if subprocess.run(cmds['glibc front (daemon)'], env=env, stderr=subprocess.DEVNULL).returncode == 0:
            break
        time.sleep(0.1)
    for c in cmds.values():
        for _ in range(10):
            subprocess.run(c, env=env, check=True)
    wall = {k: [] for k in cmds}
    cpu = {k: [0.0, 0] for k in cmds}
    names = list(cmds)
    for block in range(4):
        for k in names[block % 3:] + names[:block % 3]:
            time.sleep(0.5)
            b0 = busy()
            for _ in range(50):
                t = time.perf_counter()
                subprocess.run(cmds[k], env=env, check=True)
                wall[k].append(1e3 * (time.perf_counter() - t))
            cpu[k][0] += busy() - b0
            cpu[k][1] += 50
    print(json.dumps({'wall_ms': wall, 'busy_cpu_ms_per_run': {k: 1e3 * s / n for k, (s, n) in cpu.items()}}))
finally:
    daemon.terminate()
    daemon.wait()
