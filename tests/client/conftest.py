"""Agents with controllable behaviour, and clients over a simulated or embedded engine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import InfrastructureError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import ChatResult
from rollway.results import AgentResult
from tests.agents.server.fixtures import wait_until


class ScriptedAgent(AgentLoop):
    """Does what the task says: ``wait`` seconds, ``chats`` model calls, then ``end``."""

    name = "scripted"
    running: ClassVar[int] = 0
    peak: ClassVar[int] = 0
    starts: ClassVar[list[float]] = []
    attempts: ClassVar[dict[str, int]] = {}
    #: What ``ctx.chat`` answered, by rollout id.
    answers: ClassVar[dict[str, list[ChatResult]]] = {}

    async def run(self, ctx: RolloutContext) -> AgentResult:
        cls = type(self)
        cls.starts.append(time.monotonic())
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        try:
            return await self._act(ctx)
        finally:
            cls.running -= 1

    async def _act(self, ctx: RolloutContext) -> AgentResult:
        task = ctx.task
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.get("q", "hi")}]
        if task.get("wait"):
            await asyncio.sleep(task["wait"])
        for _ in range(task.get("chats", 1)):
            reply = await ctx.chat(messages)
            type(self).answers.setdefault(ctx.rollout_id, []).append(reply)
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
    ScriptedAgent.answers = {}


@pytest.fixture
def make_client(renderer: ChatRenderer, tmp_path: Path) -> Iterator[Callable[..., RolloutClient]]:
    clients: list[RolloutClient] = []

    def make(sim: SimConfig | None = None, **kwargs: Any) -> RolloutClient:
        gateway = Gateway(SimEngine(sim or SimConfig()), renderer, model_name="sim")
        kwargs.setdefault("store", str(tmp_path / "runs"))
        if "retry" not in kwargs:
            kwargs.setdefault("max_retry_attempts", 3)
        client = RolloutClient(kwargs.pop("agent", ScriptedAgent), gateway, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@contextlib.contextmanager
def spawn_agent_server(
    log: Path, key: str, *args: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``rollway serve-agent`` (``TaskDrivenAgent``) in a subprocess on a free loopback port,
    up and answering; killed at the end if still alive. Yields its URL and process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "rollway", "serve-agent",
             "tests/agents/server/agents.py:TaskDrivenAgent", "--port", str(port), *args],
            env={**os.environ, "ROLLWAY_AGENT_KEY": key}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return httpx.get(f"{url}/health").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=60)
        yield url, process
    finally:
        process.kill()
        process.wait(30)
