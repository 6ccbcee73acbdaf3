"""Agents with controllable behaviour, and clients over a simulated or embedded engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import InfrastructureError
from rollway.gateway import ChatRenderer, Gateway
from rollway.types import RolloutResult


class ScriptedAgent(AgentLoop):
    """Does what the task says: ``wait`` seconds, ``chats`` model calls, then ``end``."""

    name = "scripted"
    running: ClassVar[int] = 0
    peak: ClassVar[int] = 0
    starts: ClassVar[list[float]] = []
    attempts: ClassVar[dict[str, int]] = {}

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        cls = type(self)
        cls.starts.append(time.monotonic())
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        try:
            return await self._act(ctx)
        finally:
            cls.running -= 1

    async def _act(self, ctx: RolloutContext) -> RolloutResult:
        task = ctx.task
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.get("q", "hi")}]
        if task.get("wait"):
            await asyncio.sleep(task["wait"])
        for _ in range(task.get("chats", 1)):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": "more"}]
        end = task.get("end", "complete")
        key = f"{task.get('task_id')}:{ctx.rollout_id.rsplit('.', 2)[-2]}"
        type(self).attempts[key] = type(self).attempts.get(key, 0) + 1
        if end == "raise":
            raise ValueError("agent bug")
        if end == "flaky" and type(self).attempts[key] == 1:
            raise InfrastructureError("sandbox lost")
        if end == "error":
            return ctx.error("gave up", messages)
        if end == "none":
            return None  # type: ignore[return-value]
        return ctx.complete(messages, reward=task.get("reward"))


@pytest.fixture(autouse=True)
def reset_scripted_agent() -> None:
    ScriptedAgent.running = ScriptedAgent.peak = 0
    ScriptedAgent.starts = []
    ScriptedAgent.attempts = {}


@pytest.fixture
def make_client(renderer: ChatRenderer, tmp_path: Path) -> Iterator[Callable[..., RolloutClient]]:
    clients: list[RolloutClient] = []

    def make(sim: SimConfig | None = None, **kwargs: Any) -> RolloutClient:
        gateway = Gateway(SimEngine(sim or SimConfig()), renderer, model_name="sim")
        kwargs.setdefault("store", str(tmp_path / "runs"))
        kwargs.setdefault("max_retry_attempts", 3)
        client = RolloutClient(kwargs.pop("agent", ScriptedAgent), gateway, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
