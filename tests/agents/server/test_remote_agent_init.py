"""A rollout's init on an agent server, under the ``AGENT_INIT`` policy: a server at capacity
(429) is waited out for its ``Retry-After`` without using up a try; one that fails (5xx) gets
three tries in all, paced like the poll."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollway.agents.context import RolloutContext
from rollway.agents.server.remote_agent import PollPolicy, RemoteAgent, run_key
from rollway.errors import InfrastructureError
from rollway.results import AgentReport
from rollway.rollouts.spec import RolloutConfig
from rollway.store.file import FileStore
from rollway.web.background_server import BackgroundServer
from tests.agents.server.fixtures import KEY

RETRY_AFTER_S = 0.05
POLL = PollPolicy(initial_s=0.01, max_s=0.05)


@dataclass
class ScriptedServer:
    """An agent server whose inits answer ``statuses`` in turn (then 202)."""

    statuses: list[int]
    inits: list[float] = field(default_factory=list)

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"agent": "scripted", "tools": []})

    async def init(self, request: Request) -> JSONResponse:
        self.inits.append(time.monotonic())
        status = self.statuses.pop(0) if self.statuses else 202
        if status == 429:
            return JSONResponse({}, 429, headers={"Retry-After": str(RETRY_AFTER_S)})
        return JSONResponse({"run_key": "k"}, status)

    def gaps(self) -> list[float]:
        return [later - earlier for earlier, later in itertools.pairwise(self.inits)]


Start = Callable[[list[int]], tuple[ScriptedServer, str]]


@pytest.fixture
def scripted() -> Iterator[Start]:
    servers: list[BackgroundServer] = []

    def start(statuses: list[int]) -> tuple[ScriptedServer, str]:
        script = ScriptedServer(statuses)
        routes = [
            Route("/v1/health", script.health),
            Route("/v1/rollout/init", script.init, methods=["POST"]),
        ]
        server = BackgroundServer(Starlette(routes=routes))
        servers.append(server)
        return script, server.start()

    yield start
    for server in servers:
        server.stop()


async def run_remote(url: str, tmp_path: Path) -> float | None:
    """Run one rollout on the agent server at ``url``; its report is already in the store,
    so the rollout ends at the first look after a successful init."""
    agent = RemoteAgent(url, api_key=KEY, poll=POLL)
    store = FileStore(str(tmp_path), "exp")
    key = run_key("r1", "rk-test")
    store.write_report(
        AgentReport(run_key=key, rollout_id="r1", agent="scripted", status="completed",
                    reward=1.0, started_at=time.time())
    )  # fmt: skip
    agent.bind(store, None, RolloutConfig(exp_id="exp"))
    ctx = RolloutContext(
        {}, [], "r1", SimpleNamespace(model_name="sim"),  # type: ignore[arg-type]
        base_url="http://127.0.0.1:9/v1/rollouts/r1", api_key="rk-test",
    )  # fmt: skip
    try:
        return (await agent.run(ctx)).reward
    finally:
        await agent.aclose()


async def test_overloads_are_waited_out_and_failures_retried_until_init_succeeds(
    scripted: Start, tmp_path: Path
) -> None:
    script, url = scripted([429, 503, 429, 429, 503])
    assert await run_remote(url, tmp_path) == 1.0
    assert len(script.inits) == 6
    after = script.gaps()
    # 429: its Retry-After; the first and second 503: twice the first poll interval, doubling.
    waits = [RETRY_AFTER_S, 2 * POLL.initial_s, RETRY_AFTER_S, RETRY_AFTER_S, 4 * POLL.initial_s]
    assert all(gap >= wait for gap, wait in zip(after, waits, strict=True)), after


async def test_the_third_failure_fails_the_init_and_overloads_do_not_count(
    scripted: Start, tmp_path: Path
) -> None:
    script, url = scripted([503, 429, 503, 429, 429, 503, 202])
    with pytest.raises(InfrastructureError):
        await run_remote(url, tmp_path)
    assert len(script.inits) == 6  # three failures, three overloads; the 202 never asked for
