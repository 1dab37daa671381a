"""The Gymnasium environment (catalogue and free-text actions), the vector environment and
the example training loop, against a live server."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envfactory import EnvFactoryEnv, EnvFactoryVectorEnv


def test_catalogue_env_passes_check_env(server):
    env = EnvFactoryEnv(server.url, task="archive-logs", seeds=[1, 2])
    try:
        check_env(env, skip_render_check=False)
        obs, info = env.reset(seed=1)
        assert obs.shape == env.observation_space.shape and obs.dtype == np.float32
        assert info["catalogue"] == env.catalogue and info["seed"] == 1
        obs, reward, term, trunc, info = env.step(0)
        assert isinstance(reward, float) and not term and info["infra_failure"] is False
        assert "text" in info and 0.0 <= info["progress"] <= 1.0
    finally:
        env.close()


def test_text_env_passes_check_env(server):
    env = EnvFactoryEnv(server.url, task="archive-logs", action_mode="text", render_mode="ansi")
    try:
        check_env(env)
        env.reset(seed=3)
        obs, reward, term, trunc, info = env.step("echo gym-text")
        assert "gym-text" in env.render()
    finally:
        env.close()


def test_vector_env_steps_sessions_concurrently(server):
    venv = EnvFactoryVectorEnv(server.url, num_envs=4, task="archive-logs", seeds=[1, 2, 3, 4])
    try:
        obs, info = venv.reset(seed=0)
        assert obs.shape == (4, venv.single_observation_space.shape[0])
        rng = np.random.default_rng(0)
        ended = 0
        for _ in range(40):
            obs, rew, term, trunc, info = venv.step(rng.integers(0, len(venv.catalogue), size=4))
            assert obs.shape[0] == 4 and rew.shape == (4,)
            assert not info["infra_failure"].any()
            ended += int((term | trunc).sum())
        assert venv.action_space.shape == (4,)
    finally:
        venv.close()


def test_vector_env_sizes_actions_by_the_largest_catalogue_and_masks(server):
    # repair-config has an action per setting the instruction names: seed 2 has 13 actions,
    # seed 1 has 14; the first session gets seed 2.
    venv = EnvFactoryVectorEnv(server.url, num_envs=2, task="repair-config", seeds=[2, 1])
    try:
        assert [len(c) for c in venv.catalogues] == [13, 14]
        assert venv.single_action_space.n == 14
        obs, info = venv.reset(seed=0)
        assert info["action_mask"].tolist() == [[1] * 13 + [0], [1] * 14]
        with pytest.raises(ValueError, match="session 0: action 13"):
            venv.step(np.array([13, 13]))
        obs, rew, term, trunc, info = venv.step(np.array([0, 13]))
        assert not info["infra_failure"].any() and info["action_mask"].shape == (2, 14)
    finally:
        venv.close()
    wide = EnvFactoryVectorEnv(server.url, num_envs=1, task="repair-config", seeds=[2], num_actions=20)
    try:
        assert wide.single_action_space.n == 20
        assert wide.action_mask().tolist() == [[1] * 13 + [0] * 7]
    finally:
        wide.close()


def test_example_training_loop_runs(server):
    example = Path(__file__).resolve().parents[1] / "examples" / "train_reinforce.py"
    r = subprocess.run(
        [sys.executable, str(example), "--url", server.url, "--iterations", "2", "--envs", "2"],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "iteration 2" in r.stdout
