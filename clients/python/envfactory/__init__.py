"""Clients for EnvFactory's ``engine serve`` (the OpenEnv wire protocol).

- :class:`AsyncSession` / :class:`Session`: one server session over the WebSocket ``/ws``
  (reset, step by command or catalogue index, state, close).
- :class:`EnvFactoryEnv`: a Gymnasium environment (catalogue or free-text actions).
- :class:`EnvFactoryVectorEnv`: N sessions stepped concurrently, as a Gymnasium vector env.
"""

from .client import AsyncSession, ServerError, Session, StepResult
from .gym_env import EnvFactoryEnv
from .vector import EnvFactoryVectorEnv

__all__ = [
    "AsyncSession",
    "Session",
    "ServerError",
    "StepResult",
    "EnvFactoryEnv",
    "EnvFactoryVectorEnv",
]
