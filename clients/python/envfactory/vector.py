"""N sessions of one server stepped concurrently: a Gymnasium vector environment."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Sequence

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from .client import AsyncSession, StepResult, run
from .gym_env import features_of, info_of, reset_args


class EnvFactoryVectorEnv(VectorEnv):
    """``num_envs`` catalogue-action sessions; an episode that ends is reset in the same step
    (``autoreset_mode`` ``SAME_STEP``: the final observation is in ``info["final_obs"]``).

    A task's catalogue may differ between its instances (repair-config has an action per
    setting): the action space is ``Discrete(num_actions)``, by default the largest catalogue
    among the first episodes of all the sessions, and ``info["action_mask"]`` (``num_envs`` x
    ``num_actions``, int8) marks the indices valid in each session's current episode. An index
    outside its episode's catalogue is refused with ``ValueError``."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(
        self,
        base_url: str,
        num_envs: int,
        task: Optional[str] = None,
        perturbations: Optional[Sequence[str]] = None,
        seeds: Optional[Sequence[int]] = None,
        token: Optional[str] = None,
        num_actions: Optional[int] = None,
    ):
        self.num_envs = num_envs
        self._args = reset_args(task, perturbations)
        self._seeds = list(seeds) if seeds else None
        self._sessions = [AsyncSession(base_url, token) for _ in range(num_envs)]
        first = run(self._reset_all([self._seed_for(i, 0) for i in range(num_envs)]))
        self.catalogues: List[List[str]] = [list(r.observation.get("catalogue", [])) for r in first]
        # The largest catalogue seen (the one `catalogue` names, for a single-space caller).
        self.catalogue: List[str] = max(self.catalogues, key=len)
        n = int(num_actions) if num_actions is not None else len(self.catalogue)
        if n < 1:
            raise ValueError("the task has no action catalogue (or num_actions < 1)")
        self._dim = len(first[0].observation.get("features", []))
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (self._dim,), np.float32)
        self.single_action_space = gym.spaces.Discrete(n)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._episodes = [0] * num_envs

    def _seed_for(self, i: int, episode: int) -> int:
        if self._seeds:
            return int(self._seeds[(i + episode * self.num_envs) % len(self._seeds)])
        return int(self.np_random.integers(0, 2**31 - 1))

    async def _reset_all(self, seeds: List[int]) -> List[StepResult]:
        return list(
            await asyncio.gather(*(s.reset(seed=sd, **self._args) for s, sd in zip(self._sessions, seeds)))
        )

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        if seed is not None:
            self._np_random, _ = gym.utils.seeding.np_random(seed)
        self._episodes = [0] * self.num_envs
        rs = run(self._reset_all([self._seed_for(i, 0) for i in range(self.num_envs)]))
        self._note_catalogues(rs)
        obs = np.stack([features_of(r, self._dim) for r in rs])
        return obs, {
            "progress": np.array([r.observation.get("progress", 0.0) for r in rs]),
            "action_mask": self.action_mask(),
        }

    def _note_catalogues(self, results: List[StepResult]) -> None:
        for i, r in enumerate(results):
            if "catalogue" in r.observation:
                self.catalogues[i] = list(r.observation["catalogue"])

    def action_mask(self) -> np.ndarray:
        """Which indices each session's current episode accepts."""
        n = int(self.single_action_space.n)
        mask = np.zeros((self.num_envs, n), dtype=np.int8)
        for i, c in enumerate(self.catalogues):
            mask[i, : min(len(c), n)] = 1
        return mask

    async def _step_one(self, i: int, a: int):
        r = await self._sessions[i].step(int(a))
        final = None
        if r.done:
            self._episodes[i] += 1
            final = r
            r = await self._sessions[i].reset(seed=self._seed_for(i, self._episodes[i]), **self._args)
        return final or r, r

    def step(self, actions):
        for i, a in enumerate(actions):
            if not 0 <= int(a) < len(self.catalogues[i]):
                raise ValueError(
                    f"session {i}: action {int(a)} is outside its episode's catalogue "
                    f"(0..{len(self.catalogues[i]) - 1}; see info['action_mask'])"
                )
        pairs = run(self._gather_steps(actions))
        # A session reset in this step has its new episode's catalogue.
        self._note_catalogues([cur for _, cur in pairs])
        obs = np.stack([features_of(cur, self._dim) for _, cur in pairs])
        rewards = np.array([float(done.reward or 0.0) for done, _ in pairs])
        term = np.array([done.terminated and done is not cur for done, cur in pairs])
        trunc = np.array([done.truncated and done is not cur for done, cur in pairs])
        infos = [info_of(done) for done, _ in pairs]
        info: Dict[str, Any] = {
            "progress": np.array([i["progress"] for i in infos]),
            "infra_failure": np.array([bool(i["infra_failure"]) for i in infos]),
            "success": np.array([bool(i.get("success", False)) for i in infos]),
            "action_mask": self.action_mask(),
        }
        ended = term | trunc
        if ended.any():
            info["final_obs"] = np.array(
                [features_of(d, self._dim) if e else None for (d, _), e in zip(pairs, ended)], dtype=object
            )
            info["_final_obs"] = ended
        return obs, rewards, term, trunc, info

    async def _gather_steps(self, actions):
        return await asyncio.gather(*(self._step_one(i, a) for i, a in enumerate(actions)))

    async def _close_all(self) -> None:
        await asyncio.gather(*(s.close() for s in self._sessions))

    def close_extras(self, **kwargs: Any) -> None:
        run(self._close_all())
