"""`engine serve` driven by the real OpenEnv client (`openenv-core`'s GenericEnvClient) and
checked by `openenv validate`."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from openenv.core.generic_client import GenericEnvClient


def solve_archive(cwd):
    root = cwd.lstrip("/")
    return f"cd / && find {root} -type f -name '*.log' | tar -czf /logs.tar.gz -T -"


def test_openenv_validate_passes(server):
    exe = Path(sys.executable).parent / "openenv"
    r = subprocess.run([str(exe), "validate", server.url], capture_output=True, text=True, timeout=120)
    report = json.loads(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert report["passed"] is True
    assert report["mode"] == "simulation"
    assert report["standard_profile"] == "openenv-http/1.x"


def test_generic_client_plays_and_solves_an_episode(server):
    with GenericEnvClient(base_url=server.url).sync() as env:
        r = env.reset(task="archive-logs", seed=3, episode_id="ep-1")
        assert r.done is False and r.reward is None
        obs = r.observation
        assert "archive" in obs["instruction"].lower() or ".log" in obs["instruction"]
        assert obs["catalogue"] and len(obs["features"]) > 100
        assert obs["info"]["infra_failure"] is False

        r = env.step({"command": "echo hello-from-the-sandbox"})
        assert r.observation["stdout"].strip() == "hello-from-the-sandbox"
        assert r.observation["exit_code"] == 0 and r.done is False
        r = env.step({"index": 0})
        assert r.observation["last_command"] == obs["catalogue"][0]

        st = env.state()
        assert st["step_count"] == 2 and st["episode_id"] == "ep-1" and st["task"] == "archive-logs"
        assert st["seed"] == 3 and st["instance"].startswith("i-")

        r = env.step({"command": solve_archive(obs["cwd"])})
        assert r.done is True, r.observation["info"]["checks"]
        assert r.observation["terminated"] is True and r.observation["info"]["success"] is True
        assert r.reward > 0.5 and r.observation["progress"] == pytest.approx(1.0)
        with pytest.raises(RuntimeError, match="EXECUTION_ERROR"):
            env.step({"command": "true"})
    server.wait_idle()


def test_reset_arguments_choose_the_plan(server):
    with GenericEnvClient(base_url=server.url).sync() as env:
        r = env.reset(task="archive-logs", seed=2, perturbations=["tool-missing:tool=tar"])
        r = env.step({"command": "command -v tar || echo no-tar"})
        assert "no-tar" in r.observation["stdout"]
        a = env.state()["instance"]
        r = env.reset(task="archive-logs", seed=2)
        r = env.step({"command": "command -v tar"})
        assert r.observation["exit_code"] == 0
        assert env.state()["instance"] != a
        r = env.reset(template="archive-logs", seed=5)
        assert env.state()["task"] == "archive-logs"
        r = env.reset(task="kill-runaway", seed=1, features=False)
        assert "features" not in r.observation and env.state()["task"] == "kill-runaway"


def test_many_sessions_at_once_are_isolated(server):
    n = 12

    async def one(i):
        env = GenericEnvClient(base_url=server.url)
        async with env:
            await env.reset(task="archive-logs", seed=1)
            await env.step({"command": f"echo secret-{i} > /root/mine; sleep 0.2"})
            r = await env.step({"command": "cat /root/mine; ls /root"})
            st = await env.state()
            return i, r.observation["stdout"], st["session_id"]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(n)))

    results = asyncio.run(main())
    assert len({sid for _, _, sid in results}) == n
    for i, out, _ in results:
        assert out.split()[0] == f"secret-{i}", out
        assert out.split().count("mine") == 1
    c = server.wait_idle()
    assert c["pooled_envs"] <= 8
