"""Agent servers and callback receivers on loopback ports chosen by the OS."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollway.agents.server import AgentServerConfig, AgentService, create_app
from rollway.web.background_server import BackgroundServer
from tests.agents.server.agents import TaskDrivenAgent

KEY = "agent-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class AgentServer:
    url: str
    service: AgentService
    http: httpx.Client

    def init(self, rollout_id: str, gateway_url: str = "http://127.0.0.1:9", **body: Any) -> Any:
        payload = {
            "rollout_id": rollout_id,
            "exp_id": "exp",
            "base_url": f"{gateway_url}/v1/rollouts/{rollout_id}",
            "api_key": "rk-test",
            "task": {},
            **body,
        }
        return self.http.post("/v1/rollout/init", json=payload, headers=AUTH)

    def wait_finished(self, rollout_id: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.http.get(f"/v1/rollout/{rollout_id}", headers=AUTH).json()
            if status["status"] != "running" and status["callback"] != "pending":
                return status
            time.sleep(0.02)
        raise AssertionError(f"{rollout_id} did not finish")


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def agent_server(tmp_path: Path) -> Iterator[Callable[..., AgentServer]]:
    servers: list[tuple[BackgroundServer, httpx.Client]] = []
    TaskDrivenAgent.started = []
    TaskDrivenAgent.answers = {}

    def start(agent: Any = TaskDrivenAgent, **config: Any) -> AgentServer:
        config.setdefault("store", str(tmp_path / "reports"))
        config.setdefault("callback_wait_s", 0.01)
        app = create_app(agent, api_key=KEY, config=AgentServerConfig(**config))
        server = BackgroundServer(app)
        url = server.start()
        http = httpx.Client(base_url=url, timeout=30)
        servers.append((server, http))
        return AgentServer(url, app.state.service, http)

    yield start
    for server, http in servers:
        http.close()
        server.stop()


@dataclass
class Receiver:
    """A callback receiver answering with ``statuses`` in turn (then 200)."""

    statuses: list[int] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    accepted: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    async def completed(self, request: Request) -> Response:
        self.bodies.append(await request.json())
        self.keys.append(request.headers.get("authorization"))
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.accepted.set()
        return JSONResponse({}, status_code=status)


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    servers: list[BackgroundServer] = []

    def start(statuses: list[int] | None = None) -> Receiver:
        receiver = Receiver(statuses or [])
        route = Route("/v1/rollout/completed", receiver.completed, methods=["POST"])
        app = Starlette(routes=[route])
        server = BackgroundServer(app)
        receiver.url = server.start()
        servers.append(server)
        return receiver

    yield start
    for server in servers:
        server.stop()
