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
from rollway.client.batch import should_rerun
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.rollouts import ServingConfig
from rollway.trajectory_format import whole_prompts
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
        assert sample.prompt_ids == trajectory.prompt_ids(0)
        sampled = [i for i, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
        assert sampled == [i for t in trajectory.turns for i in t.completion_ids]
    assert server.service.runs_started == 6
    # The server marks a callback delivered once the client's answer reaches it, which may
    # come after the client has recorded the rollout.
    runs = server.service._runs.values()
    wait_until(lambda: all(run.callback == "delivered" for run in runs), timeout=10)


def test_what_a_served_agent_ends_with_and_its_metrics_reach_the_record(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    server = agent_server()
    client = remote_client(server)
    task = {"task_id": "capped", "chats": 2, "finish_reason": "max_steps", "sleep": 0.2}
    record = client.invoke(task).result(30)
    assert record.status == "completed" and record.finish_reason == "max_steps"
    passed = server.service.get(record.rollout_id).report.messages
    assert record.messages == passed and len(passed) == 5  # user, (reply, user) twice
    assert passed[-1] == {"role": "user", "content": "again"}  # the agent's, not the gateway's
    turns = record.trajectory.turns
    metrics = record.metrics
    assert metrics.llm_calls == len(turns) == 2
    assert metrics.prompt_tokens == sum(len(prompt) for _, prompt in whole_prompts(turns)) > 0
    assert metrics.response_tokens == sum(len(t.completion_ids) for t in turns) > 0
    assert metrics.llm_latency_ms > 0
    # The client's wall time of the run holds the served agent's sleep and model calls.
    assert metrics.total_latency_ms >= 200 + metrics.llm_latency_ms
    failed = client.invoke({"task_id": "gave-up", "chats": 1, "end": "error"}).result(30)
    assert (failed.status, failed.finish_reason, failed.reason) == ("error", "error", "gave up")
    assert failed.messages == server.service.get(failed.rollout_id).report.messages
    assert len(failed.messages) == 3


def test_ctx_chat_on_an_agent_server_returns_the_recorded_ids_and_logprobs(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    client = remote_client(agent_server())
    record = client.invoke({"task_id": "t", "chats": 2}).result(30)
    assert record.status == "completed" and record.trajectory is not None
    answers = TaskDrivenAgent.answers[record.rollout_id]
    turns = record.trajectory.turns
    assert len(answers) == len(turns) == 2 and all(turn.completion_ids for turn in turns)
    assert [(a.completion_ids, a.logprobs, a.turn_index) for a in answers] == [
        (turn.completion_ids, turn.logprobs, turn.index) for turn in turns
    ]


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
    # It waits for the server to come back for as long as its timeout allows, then gives up.
    client = remote_client(url, poll=poll, max_retry_attempts=2, timeout=3.0)
    future = client.invoke({"task_id": "orphan", "sleep": 60})
    running = {"Authorization": f"Bearer {KEY}"}
    wait_until(lambda: httpx.get(f"{url}/v1/health", headers=running).json()["running"] == 1)
    process.kill()  # no report, no callback: it is just gone
    process.wait(30)
    record = future.result(timeout=30)
    assert (record.status, record.error_kind) == ("error", "infrastructure"), record.reason
    assert (record.reason or "").startswith(f"the agent server at {url} was down for")
    # The attempt its death ended was not counted, and no other started against it.
    assert record.attempts == 1 and record.rollout_id.endswith(".1")
    assert "unreachable" in (record.reason or "")  # how the attempt ended


def test_an_agent_server_that_dies_for_good_is_blamed_not_the_policys_timeout(
    killable_agent_server: tuple[str, subprocess.Popen[bytes]],
    remote_client: Callable[..., RolloutClient],
) -> None:
    # The default poll policy: a dead server is noticed by its status calls only after about a
    # minute, so the rollout's own 3 s run out first. That timeout is the server's death, not
    # the policy's: an infrastructure error naming the server, which resume reruns.
    url, process = killable_agent_server
    client = remote_client(url, poll=PollPolicy(), max_retry_attempts=2, timeout=3.0)
    future = client.invoke({"task_id": "orphaned", "sleep": 60})
    running = {"Authorization": f"Bearer {KEY}"}
    wait_until(lambda: httpx.get(f"{url}/v1/health", headers=running).json()["running"] == 1)
    process.kill()
    process.wait(30)
    record = future.result(timeout=30)
    assert (record.status, record.error_kind) == ("error", "infrastructure"), record.reason
    assert (record.reason or "").startswith(f"the agent server at {url} was down for")
    assert "timed out" in (record.reason or "")  # how the attempt ended
    assert should_rerun(record)


def test_per_call_overrides_reach_the_agent_servers_init(
    agent_server: Start, remote_client: Callable[..., RolloutClient]
) -> None:
    server = agent_server()
    client = remote_client(server, timeout=30.0)
    record = client.invoke(
        {"task_id": "overridden", "chats": 1}, timeout=120.0, temperature=0.25, max_turns=4
    ).result(30)
    assert record.status == "completed"
    init = server.service.get(record.rollout_id).init
    # A little longer than the client's own timeout for this rollout: the client decides.
    assert init.limits.timeout_s == 125.0 and init.limits.max_turns == 4
    assert init.sampling["temperature"] == 0.25
    plain = client.invoke({"task_id": "plain", "chats": 1}).result(30)
    assert server.service.get(plain.rollout_id).init.limits.timeout_s == 35.0
