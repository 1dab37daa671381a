"""A Gymnasium environment over one ``engine serve`` session."""

from __future__ import annotations

import string
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np

from .client import Session, StepResult

#: Longest free-text command of the text action space.
MAX_COMMAND_CHARS = 4096


def features_of(result: StepResult, dim: int) -> np.ndarray:
    f = np.asarray(result.observation.get("features", []), dtype=np.float32)
    if f.shape != (dim,):
        raise ValueError(f"the server sent {f.shape[0]} features, expected {dim}")
    return f


def info_of(result: StepResult) -> Dict[str, Any]:
    o = result.observation
    info = dict(o.get("info", {}))
    # Wall-clock time is not part of the state: kept out so steps are deterministic.
    info.pop("duration_us", None)
    info["text"] = o.get("text", "")
    info["progress"] = o.get("progress", 0.0)
    info.setdefault("infra_failure", False)
    return info


def reset_args(
    task: Optional[str], perturbations: Optional[Sequence[str]], template: Optional[str] = None
) -> Dict[str, Any]:
    """The reset arguments that are given (the server's defaults stand for the others)."""
    args: Dict[str, Any] = {}
    if task is not None:
        args["task"] = task
    if perturbations is not None:
        args["perturbations"] = list(perturbations)
    if template is not None:
        args["template"] = template
    return args


class EnvFactoryEnv(gym.Env):
    """One sandboxed episode per reset, judged by the task's verifier.

    ``action_mode="catalogue"``: ``Discrete(n)`` over the task's action catalogue;
    ``action_mode="text"``: free-text shell commands (``gymnasium.spaces.Text``). The
    observation is the server's feature vector (``Box``); ``info`` carries the observation's
    ``text``, the verifier's ``progress`` and ``infra_failure`` (mask such steps from learning).

    Gymnasium's ``reset(seed=...)`` seeds the episode: the server's seed (the task's generation
    and the instance) is ``seed`` itself, or drawn from ``np_random`` when none is given.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        base_url: str,
        task: Optional[str] = None,
        perturbations: Optional[Sequence[str]] = None,
        template: Optional[str] = None,
        action_mode: str = "catalogue",
        seeds: Optional[Sequence[int]] = None,
        token: Optional[str] = None,
        render_mode: Optional[str] = None,
    ):
        if action_mode not in ("catalogue", "text"):
            raise ValueError("action_mode must be 'catalogue' or 'text'")
        if render_mode not in (None, "ansi"):
            raise ValueError("render_mode must be None or 'ansi'")
        self.render_mode = render_mode
        self.action_mode = action_mode
        self._reset_args = reset_args(task, perturbations, template)
        self._seeds = list(seeds) if seeds else None
        self._session = Session(base_url, token).connect()
        # One probe episode tells the observation width and the catalogue.
        first = self._session.reset(seed=self._seeds[0] if self._seeds else 1, **self._reset_args)
        self.catalogue: List[str] = list(first.observation.get("catalogue", []))
        self._dim = len(first.observation.get("features", []))
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self._dim,), np.float32)
        if action_mode == "catalogue":
            if not self.catalogue:
                raise ValueError("the task has no action catalogue: use action_mode='text'")
            self.action_space = gym.spaces.Discrete(len(self.catalogue))
        else:
            self.action_space = gym.spaces.Text(
                max_length=MAX_COMMAND_CHARS,
                min_length=1,
                # No shell metacharacters: a sampled command never starts background jobs
                # or pipelines, so the same sample steps the same way (any text can be sent).
                charset=string.ascii_letters + string.digits + " -_./=",
            )
        self._last: Optional[StepResult] = None

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None
    ) -> Tuple[np.ndarray, Dict[str, Any]]:
        super().reset(seed=seed)
        args = dict(self._reset_args)
        args.update((options or {}).get("reset", {}))
        if seed is not None:
            server_seed = int(seed)
        elif self._seeds:
            server_seed = int(self._seeds[int(self.np_random.integers(len(self._seeds)))])
        else:
            server_seed = int(self.np_random.integers(0, 2**31 - 1))
        self._last = self._session.reset(seed=server_seed, **args)
        info = info_of(self._last)
        # A task's catalogue may grow with its instance (repair-config: an action per
        # setting): the episode's own catalogue decides which indices are valid, and
        # `action_mask` marks them within the action space (sized by the first episode).
        self.catalogue = list(self._last.observation.get("catalogue", self.catalogue))
        info["catalogue"] = list(self.catalogue)
        if self.action_mode == "catalogue":
            n = int(self.action_space.n)
            info["action_mask"] = np.array([i < len(self.catalogue) for i in range(n)], dtype=np.int8)
        info["seed"] = server_seed
        return features_of(self._last, self._dim), info

    def step(self, action: Any) -> Tuple[np.ndarray, float, bool, bool, Dict[str, Any]]:
        if self.action_mode == "catalogue":
            a: Any = int(action)
            if not 0 <= a < len(self.catalogue):
                raise ValueError(f"action {a} is outside the catalogue (0..{len(self.catalogue) - 1})")
        else:
            if not isinstance(action, str):
                raise TypeError("a text action is a str")
            a = {"command": action}
        self._last = self._session.step(a)
        return (
            features_of(self._last, self._dim),
            float(self._last.reward or 0.0),
            self._last.terminated,
            self._last.truncated,
            info_of(self._last),
        )

    def render(self) -> Optional[str]:
        if self.render_mode == "ansi" and self._last is not None:
            return self._last.observation.get("text", "")
        return None

    def close(self) -> None:
        if getattr(self, "_session", None) is not None:
            self._session.close()
            self._session = None
