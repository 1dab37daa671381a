"""Sessions of ``engine serve`` over its WebSocket ``/ws`` (the OpenEnv frames)."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from websockets.asyncio.client import connect

Action = Union[str, int, Dict[str, Any]]


class ServerError(RuntimeError):
    """An error frame: ``code`` is the protocol's (``VALIDATION_ERROR``, ``CAPACITY_REACHED``...)."""

    def __init__(self, data: Dict[str, Any]):
        self.data = data
        self.code = data.get("code", "UNKNOWN")
        self.infra_failure = bool(data.get("infra_failure", False))
        super().__init__(f"{data.get('message', 'server error')} (code: {self.code})")


@dataclass
class StepResult:
    """An observation frame: ``observation`` holds text, features, catalogue, info..."""

    observation: Dict[str, Any]
    reward: Optional[float]
    done: bool
    terminated: bool = False
    truncated: bool = False
    info: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, data: Dict[str, Any]) -> "StepResult":
        obs = data.get("observation", {})
        return cls(
            observation=obs,
            reward=data.get("reward"),
            done=bool(data.get("done", False)),
            terminated=bool(obs.get("terminated", False)),
            truncated=bool(obs.get("truncated", False)),
            info=obs.get("info", {}),
        )


def action_payload(action: Action) -> Dict[str, Any]:
    """``"ls"`` is a command, ``3`` catalogue action 3; a dict is sent as it is."""
    if isinstance(action, dict):
        return action
    if isinstance(action, str):
        return {"command": action}
    if isinstance(action, bool):
        raise TypeError("an action is a command (str) or a catalogue index (int), not a bool")
    return {"index": int(action)}


def ws_url(base_url: str) -> str:
    u = base_url.rstrip("/")
    if u.startswith("http://"):
        u = "ws://" + u[len("http://"):]
    elif u.startswith("https://"):
        u = "wss://" + u[len("https://"):]
    return u + "/ws"


class AsyncSession:
    """One session (one sandbox) of a server. ``async with AsyncSession(url) as s: ...``"""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout_s: float = 120.0):
        self.base_url = base_url
        self.token = token
        self.timeout_s = timeout_s
        self._ws = None

    async def connect(self) -> "AsyncSession":
        if self._ws is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
            self._ws = await connect(
                ws_url(self.base_url), additional_headers=headers, max_size=64 << 20
            )
        return self

    async def _call(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        await self.connect()
        await self._ws.send(json.dumps(msg))
        reply = json.loads(await asyncio.wait_for(self._ws.recv(), self.timeout_s))
        if reply.get("type") == "error":
            raise ServerError(reply.get("data", {}))
        return reply

    async def reset(self, **kwargs: Any) -> StepResult:
        """``task``, ``seed``, ``template``, ``perturbations`` (specs), ``episode_id``, ``features``,
        ``max_steps`` (this episode's step limit)."""
        return StepResult.of((await self._call({"type": "reset", "data": kwargs}))["data"])

    async def step(self, action: Action) -> StepResult:
        return StepResult.of((await self._call({"type": "step", "data": action_payload(action)}))["data"])

    async def state(self) -> Dict[str, Any]:
        return (await self._call({"type": "state"}))["data"]

    async def close(self) -> None:
        if self._ws is not None:
            try:
                await self._ws.send(json.dumps({"type": "close"}))
            except Exception:
                pass
            await self._ws.close()
            self._ws = None

    async def __aenter__(self) -> "AsyncSession":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class _Loop:
    """An event loop on a daemon thread, shared by the synchronous wrappers."""

    _lock = threading.Lock()
    _loop: Optional[asyncio.AbstractEventLoop] = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, daemon=True, name="envfactory").start()
                cls._loop = loop
            return cls._loop


def run(coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, _Loop.get()).result()


class Session:
    """The synchronous session: ``with Session(url) as s: s.reset(task=...); s.step("ls")``."""

    def __init__(self, base_url: str, token: Optional[str] = None, timeout_s: float = 120.0):
        self._s = AsyncSession(base_url, token, timeout_s)

    def connect(self) -> "Session":
        run(self._s.connect())
        return self

    def reset(self, **kwargs: Any) -> StepResult:
        return run(self._s.reset(**kwargs))

    def step(self, action: Action) -> StepResult:
        return run(self._s.step(action))

    def state(self) -> Dict[str, Any]:
        return run(self._s.state())

    def close(self) -> None:
        run(self._s.close())

    def __enter__(self) -> "Session":
        return self.connect()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def catalogue_of(result: StepResult) -> List[str]:
    return list(result.observation.get("catalogue", []))
