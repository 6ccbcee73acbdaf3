"""``RolloutClient(agent="http://...")``: the same outcomes, limits, timeouts and cancellation as
an in-process agent, with reports arriving by callback or found by polling the store."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollway.agents.server.remote_agent import PollPolicy
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError
from rollway.gateway import ChatRenderer, Gateway
from rollway.rollouts import ServingConfig
from tests.agents.server.agents import TaskDrivenAgent
from tests.agents.server.fixtures import KEY, AgentServer, wait_until
from tests.client.conftest import spawn_agent_server

Start = Callable[..., AgentServer]


@pytest.fixture
def remote_client(renderer: ChatRenderer, tmp_path: Path) -> Iterator[Callable[..., RolloutClient]]:
    clients: list[RolloutClient] = []

    def make(server: AgentServer | str, **kwargs: Any) -> RolloutClient:
        gateway = Gateway(SimEngine(SimConfig(latency_s=0.01)), renderer, model_name="sim")
        kwargs.setdefault("store", str(tmp_path / "reports"))
        kwargs.setdefault("poll", PollPolicy(initial_s=0.05, max_s=0.2, status_every_s=0.5))
        url = server if isinstance(server, str) else server.url
        client = RolloutClient(url, gateway, agent_key=KEY, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def test_a_batch_on_an_agent_server_records_every_rollout_token_exactly(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    server = agent_server()
    client = remote_client(server, max_concurrent=4)
    assert client.exp_id == "task-driven"
    tasks = [{"task_id": f"t{i}", "chats": 2, "reward": float(i)} for i in range(3)]
    items = list(client.run_batch(tasks, group_size=2))
    assert len(items) == 6 and all(item.success for item in items)
    for item in items:
        record = item.result
        assert record.reward == float(record.task["reward"])
        assert record.metrics.llm_calls == 2
        trajectory = record.trajectory
        assert trajectory is not None and len(trajectory.turns) == 2
        sample = trajectory.samples[0]
        assert sample.prompt_ids == trajectory.turns[0].prompt_ids
        sampled = [i for i, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
        assert sampled == [i for t in trajectory.turns for i in t.completion_ids]
    assert server.service.runs_started == 6
    # The server marks a callback delivered once the client's answer reaches it, which may
    # come after the client has recorded the rollout.
    runs = server.service._runs.values()
    wait_until(lambda: all(run.callback == "delivered" for run in runs), timeout=10)


def test_without_callbacks_the_store_is_polled(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    server = agent_server()
    client = remote_client(server, serving=ServingConfig(callback=False))
    record = client.invoke({"task_id": "t", "chats": 1, "reward": 1.0}).result(30)
    assert record.status == "completed" and record.reward == 1.0
    assert all(run.callback == "none" for run in server.service._runs.values())


def test_an_agent_server_without_a_store_is_asked_for_the_report(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    server = agent_server(store=None)
    client = remote_client(server, serving=ServingConfig(callback=False))
    record = client.invoke({"task_id": "t", "reward": 2.0}).result(30)
    assert record.status == "completed" and record.reward == 2.0


def test_timeouts_and_cancels_reach_the_agent_server(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    server = agent_server(stop_grace_s=0.1)
    client = remote_client(server, timeout=0.5, stop_grace_s=0.5)
    timed_out = client.invoke({"task_id": "slow", "sleep": 60}).result(30)
    assert timed_out.status == "timeout"
    future = client.invoke({"task_id": "cancelled", "sleep": 60})
    wait_until(lambda: server.service.running == 1)
    future.cancel()
    assert future.result(30).status == "cancelled"
    runs = list(server.service._runs.values())
    assert len(runs) == 2
    for run in runs:
        assert server.wait_finished(run.init.rollout_id)["status"] == "cancelled"


def test_agent_failures_keep_their_kind_and_reason(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    server = agent_server()
    client = remote_client(server)
    items = {
        item.result.task["task_id"]: item.result
        for item in client.run_batch(
            [{"task_id": "r", "end": "raise"}, {"task_id": "e", "end": "error"}]
        )
    }
    assert items["r"].status == "error" and items["r"].error_kind == "agent"
    assert "ValueError: agent bug" in (items["r"].reason or "")
    assert items["e"].reason == "gave up"


def test_a_wrong_url_or_key_fails_before_any_rollout(agent_server: Start, renderer) -> None:
    server = agent_server()
    gateway = Gateway(SimEngine(SimConfig()), renderer, model_name="sim")
    with pytest.raises(ConfigError, match="refused the key"):
        RolloutClient(server.url, gateway, agent_key="wrong")
    with pytest.raises(ConfigError, match="no agent server"):
        RolloutClient("http://127.0.0.1:9", gateway, agent_key=KEY)
    assert TaskDrivenAgent.started == []


@pytest.fixture
def killable_agent_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with spawn_agent_server(tmp_path / "agent-server.log", KEY) as served:
        yield served


def test_an_agent_server_that_dies_for_good_ends_the_wait_as_an_infrastructure_error(
    killable_agent_server: tuple[str, subprocess.Popen[bytes]],
    remote_client: Callable[..., RolloutClient],
) -> None:
    url, process = killable_agent_server
    poll = PollPolicy(initial_s=0.05, max_s=0.2, status_every_s=0.2, max_status_failures=3)
    client = remote_client(url, poll=poll, max_retry_attempts=2)
    future = client.invoke({"task_id": "orphan", "sleep": 60})
    running = {"Authorization": f"Bearer {KEY}"}
    wait_until(lambda: httpx.get(f"{url}/v1/health", headers=running).json()["running"] == 1)
    process.kill()  # no report, no callback: it is just gone
    process.wait(30)
    record = future.result(timeout=30)
    assert (record.status, record.error_kind) == ("error", "infrastructure"), record.reason
    assert record.attempts == 2 and record.rollout_id.endswith(".2")
    assert "unreachable" in (record.reason or "")  # the retry found it gone too
