"""Benchmark of `engine serve`: sessions held, memory per session, step latency through the
server against the environment's own step time in the same run.

    python clients/python/bench/serve_bench.py --engine target/release/engine \
        [--sessions 1000] [--active 32] [--steps 200] [--json]

It starts the server on a free loopback port, opens `--sessions` WebSocket sessions at once
(each answers a `state` frame), reads the server's resident memory before and after (per
session = the difference / sessions), resets `--active` of them (each gets its own sandbox)
and steps them with `true`, sequentially per session and concurrently across sessions. For
every step it records the client's round trip and the server's `info.duration_us` (the
in-process `Env::step`, measured inside the server): the server's overhead per step is the
round trip minus that, step by step.
"""

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

from websockets.asyncio.client import connect


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def call(s, msg):
    await s.send(json.dumps(msg))
    r = json.loads(await s.recv())
    if r["type"] == "error":
        raise RuntimeError(r["data"])
    return r


async def bench(url, pid, n, active, steps):
    base = rss_kib(pid)
    socks = await asyncio.gather(*(connect(url, max_size=None) for _ in range(n)))
    await asyncio.gather(*(call(s, {"type": "state"}) for s in socks))
    held = rss_kib(pid)
    act = socks[:active]
    await asyncio.gather(
        *(call(s, {"type": "reset", "data": {"task": "archive-logs", "seed": 1, "features": False}}) for s in act)
    )
    rtt, env, over = [], [], []

    async def run(s):
        for _ in range(steps):
            t = time.perf_counter()
            r = await call(s, {"type": "step", "data": {"command": "true"}})
            dt = (time.perf_counter() - t) * 1e6
            d = r["data"]["observation"]["info"]["duration_us"]
            if r["data"]["done"]:
                await call(s, {"type": "reset", "data": {"task": "archive-logs", "seed": 1, "features": False}})
            rtt.append(dt)
            env.append(d)
            over.append(dt - d)

    t0 = time.perf_counter()
    await asyncio.gather(*(run(s) for s in act))
    wall = time.perf_counter() - t0
    after = rss_kib(pid)
    await asyncio.gather(*(s.close() for s in socks))
    ms = lambda xs: {"p50": pct(xs, 0.5) / 1000, "p99": pct(xs, 0.99) / 1000, "n": len(xs)}
    return {
        "sessions_held": n,
        "rss_base_kib": base,
        "rss_held_kib": held,
        "memory_per_session_kib": (held - base) / n,
        "rss_with_active_kib": after,
        "active_sessions": active,
        "step_roundtrip_ms": ms(rtt),
        "env_step_in_process_ms": ms(env),
        "server_overhead_ms": ms(over),
        "overhead_ratio_p50": pct(rtt, 0.5) / max(pct(env, 0.5), 1),
        "steps_per_s": len(rtt) / wall,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="target/release/engine")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--active", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    state = os.environ.get("ENVFACTORY_STATE") or tempfile.mkdtemp(prefix="envfactory-bench-")
    env = {**os.environ, "ENVFACTORY_STATE": state}
    proc = subprocess.Popen(
        [a.engine, "serve", "--bind", "127.0.0.1:0", "--max-sessions", str(a.sessions), "--pool", str(a.active)],
        stdout=subprocess.PIPE, env=env, text=True,
    )
    try:
        url = proc.stdout.readline().split()[-1].replace("http://", "ws://") + "/ws"
        r = asyncio.run(bench(url, proc.pid, a.sessions, a.active, a.steps))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    if a.json:
        print(json.dumps(r))
    else:
        for k, v in r.items():
            print(f"{k:28} {v}")


if __name__ == "__main__":
    main()
