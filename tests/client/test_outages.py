"""A component that goes down for a few seconds mid-batch (a shared gateway, the engine behind
the client's gateway or behind a shared one, an agent server) and comes back on the same port
costs no rollout: the rollouts it interrupted wait for it without spending their tries, no
attempt starts while it is known to be down, the status lines say what they wait for, and an
outage longer than a rollout's timeout ends that rollout as an error naming what was down."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from rollway.agents.server import AgentServerConfig
from rollway.agents.server import create_app as create_agent_app
from rollway.agents.server.remote_agent import PollPolicy
from rollway.client import RolloutClient
from rollway.engines.remote.sglang import SGLangEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.events import RolloutEvent, RolloutStarted
from rollway.executors import LocalExecutor
from rollway.gateway import Gateway
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.simulators import create_sim_server_app
from tests.agents.server.agents import TaskDrivenAgent
from tests.agents.server.fixtures import KEY, wait_until
from tests.client.test_gateway_faults import ROLLOUTS, FaultAgent, ShakyGateway
from tests.restartable import RestartableProcess, RestartableServer

#: As long as the outage the issue reports: longer than a rollout's three tries take (0.5 s,
#: then 1 s of back-off), shorter than its timeout.
OUTAGE_S = 3.0


class ShakyEngineServer(RestartableServer):
    """A simulated SGLang server on a fixed loopback port; ``start`` serves a fresh one."""

    def make_app(self) -> Any:
        return create_sim_server_app(SimConfig())


class Restartable(Protocol):
    def start(self) -> str: ...
    def stop(self) -> None: ...


@dataclass
class Setup:
    """What goes down (``server``), its name in reasons and status lines, what the client
    is given as its engine."""

    server: Restartable
    name: str
    engine: Gateway | RemoteGateway
    kind: str

    def release(self, client: RolloutClient) -> None:
        """Close what the client does not (an engine object it was given), on its loop."""
        if isinstance(self.engine, Gateway):
            client._loop.call(self.engine.engine.close())


@pytest.fixture(params=["shared gateway", "engine", "engine behind a shared gateway"])
def setup(request: pytest.FixtureRequest, renderer: ChatRenderer) -> Iterator[Setup]:
    if request.param == "engine behind a shared gateway":
        yield from behind_a_shared_gateway()
    elif request.param == "shared gateway":
        gateway = ShakyGateway(renderer)
        remote = RemoteGateway(gateway.url, admin_key=gateway.admin_key)
        yield Setup(gateway, f"the shared gateway at {gateway.url}", remote, "infrastructure")
        gateway.stop()
    else:
        server = ShakyEngineServer()
        local = Gateway(SGLangEngine(server.url), renderer, model_name="sim")
        yield Setup(server, f"the engine at {server.url}", local, "engine")
        server.stop()


def behind_a_shared_gateway() -> Iterator[Setup]:
    """A real ``rollway gateway`` process in front of a simulated vLLM server process; the
    server is what goes down (SIGKILL), and comes back on the same port."""
    engine = RestartableProcess(["sim-server", "--protocol", "vllm", "--port", "{port}"])
    try:
        key = f"ak-{secrets.token_hex(8)}"
        gateway = RestartableProcess(
            ["gateway", "--engine", f"vllm://127.0.0.1:{engine.port}", "--port", "{port}"],
            env={"ROLLWAY_ADMIN_KEY": key},
        )
        try:
            name = f"the engine behind the shared gateway at {gateway.url}"
            yield Setup(engine, name, RemoteGateway(gateway.url, admin_key=key), "engine")
        finally:
            gateway.stop()
    finally:
        engine.stop()


@dataclass
class Window:
    """When the component went down and came back (wall clock, as events carry it)."""

    down_at: float = 0.0
    up_at: float = 0.0
    late: list[Any] = field(default_factory=list)


def waiting(client: RolloutClient, name: str, rollouts: int) -> bool:
    assert isinstance(client.executor, LocalExecutor)
    return any(
        line.startswith(f"waiting for {name} (down ") and line.endswith(f": {rollouts} rollouts")
        for line in client.executor.availability.status()
    )


def make_client(setup: Setup, agent: FaultAgent, tmp_path: Path, **kw: Any) -> RolloutClient:
    return RolloutClient(agent, setup.engine, store=str(tmp_path), exp_id="outage", **kw)


def test_a_component_down_for_seconds_costs_no_rollout_and_starts_nothing(
    setup: Setup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rollway.client")
    window, events = Window(), list[RolloutEvent]()
    client: RolloutClient

    def restart_after_the_outage() -> None:
        # Every rollout it interrupted waits for it; then one more is submitted.
        wait_until(lambda: waiting(client, setup.name, ROLLOUTS))
        window.late.append(client.invoke({"task_id": "late"}))
        time.sleep(max(0.0, window.down_at + OUTAGE_S - time.time()))  # the outage's length
        window.up_at = time.time()
        setup.server.start()

    restarter = threading.Thread(target=restart_after_the_outage)

    def go_down() -> None:  # in a thread, once ROLLOUTS rollouts are mid-conversation
        setup.server.stop()
        window.down_at = time.time()
        restarter.start()

    agent = FaultAgent(fault=go_down)
    client = make_client(
        setup, agent, tmp_path, max_concurrent=ROLLOUTS, on_event=events.append,
        status_interval=0.2,
    )  # fmt: skip
    tasks = [{"task_id": f"t{i}", "chats": 1} for i in range(2 * ROLLOUTS)]  # half queued
    with client:
        records = [item.result for item in client.run_batch(tasks)]
        restarter.join()
        late = window.late[0].result(timeout=30)
        setup.release(client)
    for record in [*records, late]:
        assert record.status == "completed", (record.rollout_key, record.reason)
        assert record.trajectory is not None and record.reward == 1.0
    # The interrupted attempt was not counted: each went again once, as its second attempt.
    assert sorted(r.attempts for r in records) == [1] * ROLLOUTS + [2] * ROLLOUTS
    assert late.attempts == 1
    starts = [e for e in events if isinstance(e, RolloutStarted)]
    assert len(starts) == 3 * ROLLOUTS + 1
    during = [e.rollout_id for e in starts if window.down_at < e.at < window.up_at]
    assert during == [], "attempts started while it was down"
    status = [r.getMessage() for r in caplog.records if r.name == "rollway.client"]
    assert any(f"waiting for {setup.name} (down" in line for line in status), status


def test_an_outage_longer_than_the_timeout_is_an_error_naming_the_component(
    setup: Setup, tmp_path: Path
) -> None:
    events: list[RolloutEvent] = []
    client = make_client(setup, FaultAgent(), tmp_path, timeout=1.0, on_event=events.append)
    with client:
        setup.server.stop()
        first = client.invoke({"task_id": "first"}).result(timeout=30)
        # Known to be down now: the next rollout waits its timeout without starting.
        second = client.invoke({"task_id": "second"}).result(timeout=30)
        setup.release(client)
    for record in (first, second):
        assert (record.status, record.error_kind) == ("error", setup.kind), record.reason
        assert record.reason is not None and record.reason.startswith(
            f"{setup.name} was down for"
        ), record.reason
        assert record.attempts == 1 and record.reward is None
    assert "its last attempt ended" in (first.reason or "")
    assert (second.reason or "").endswith("no attempt had started")
    started = {e.rollout_id for e in events if isinstance(e, RolloutStarted)}
    assert first.rollout_id in started and second.rollout_id not in started


class ShakyAgentServer(RestartableServer):
    """An agent server (``TaskDrivenAgent``) on a fixed loopback port; ``start`` serves a
    fresh one."""

    def __init__(self, store: Path) -> None:
        self.store = store
        super().__init__()

    def make_app(self) -> Any:
        config = AgentServerConfig(store=str(self.store), callback_wait_s=0.01)
        return create_agent_app(TaskDrivenAgent, api_key=KEY, config=config)


def test_an_agent_server_down_for_seconds_costs_no_rollout(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    server = ShakyAgentServer(tmp_path / "reports")
    name = f"the agent server at {server.url}"
    gateway = Gateway(SimEngine(SimConfig()), renderer, model_name="sim")
    client = RolloutClient(server.url, gateway, agent_key=KEY, store=str(tmp_path / "reports"))
    try:
        with client:
            server.stop()
            down_at = time.monotonic()
            future = client.invoke({"task_id": "patient", "chats": 1})
            wait_until(lambda: waiting(client, name, 1))  # its init found the server down
            time.sleep(max(0.0, down_at + OUTAGE_S - time.monotonic()))  # the outage's length
            server.start()
            record = future.result(timeout=30)
    finally:
        server.stop()
    assert record.status == "completed", record.reason
    assert record.trajectory is not None and len(record.trajectory.turns) == 1
    assert record.attempts == 2  # the one the outage ended, uncounted, and the one that ran


def test_an_agent_server_down_mid_rollout_is_one_status_line_not_a_warning_each(
    renderer: ChatRenderer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rollouts running on the agent server when it goes down: the first status call that
    finds it gone marks it down (one warning), every rollout waits for it under one status
    line, and each goes again, uncounted, once it is back."""
    caplog.set_level(logging.INFO)
    server = ShakyAgentServer(tmp_path / "reports")
    name = f"the agent server at {server.url}"
    gateway = Gateway(SimEngine(SimConfig()), renderer, model_name="sim")
    TaskDrivenAgent.started = []
    client = RolloutClient(
        server.url, gateway, agent_key=KEY, store=str(tmp_path / "reports"), timeout=60,
        poll=PollPolicy(initial_s=0.05, status_every_s=0.2), status_interval=0.2,
    )  # fmt: skip

    def outage() -> None:
        wait_until(lambda: len(TaskDrivenAgent.started) == ROLLOUTS)  # all running there
        server.stop()
        wait_until(lambda: waiting(client, name, ROLLOUTS))
        server.start()

    restarter = threading.Thread(target=outage)
    tasks = [{"task_id": f"t{i}", "chats": 1, "sleep": 2.0} for i in range(ROLLOUTS)]
    try:
        with client:
            restarter.start()
            records = [item.result for item in client.run_batch(tasks)]
            restarter.join()
    finally:
        server.stop()
    for record in records:
        assert record.status == "completed", record.reason
        assert record.attempts == 2  # the one the outage ended, uncounted, and the one that ran
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"waiting for {name} (down" in m for m in messages), messages
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    about_it = [w for w in warnings if "agent server" in w]  # none per rollout
    assert len(about_it) == 2, about_it
    assert about_it[0] == f"{name} is down: rollouts wait for it"
    assert about_it[1].startswith(f"{name} is back after")
