"""End to end across processes: ``rollway run`` (the client) drives an agent server
(``rollway serve-agent``, a subprocess) through a shared gateway on the embedded model, with
results in S3 (moto on loopback). The client is killed mid-batch and started again: the batch
finishes with every rollout recorded once and no rollout run twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollway.store import store_from_uri
from tests.agents.server.fixtures import wait_until
from tests.client.conftest import spawn_agent_server
from tests.conftest import Served
from tests.outcomes import ENDED

AGENT_KEY = "e2e-agent-key"
ROLLWAY = [sys.executable, "-m", "rollway"]
TASKS = [{"task_id": f"t{i}", "sleep": 1.0, "chats": 1, "reward": float(i)} for i in range(6)]
KEYS = [f"t{i}.{s}" for i in range(6) for s in range(2)]


@pytest.fixture
def agent_server_process(s3_env: str, tmp_path: Path) -> Iterator[str]:
    log = tmp_path / "agent-server.log"
    with spawn_agent_server(log, AGENT_KEY, "--store", s3_env) as (url, process):
        yield url
        process.terminate()
        process.wait(30)


def agent_health(url: str) -> dict:
    return httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {AGENT_KEY}"}).json()


def test_a_killed_client_restarts_and_finishes_with_nothing_lost_or_run_twice(
    served: Served, agent_server_process: str, s3_env: str, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in TASKS))
    command = [
        *ROLLWAY, "run", agent_server_process, "--tasks", str(tasks), "--group-size", "2",
        "--concurrency", "4", "--gateway", served.url, "--out", s3_env, "--exp-id", "e2e",
        "--max-tokens", "8", "--temperature", "1.0",
    ]  # fmt: skip
    env = {**os.environ, "ROLLWAY_AGENT_KEY": AGENT_KEY, "ROLLWAY_ADMIN_KEY": served.admin_key}
    store = store_from_uri(s3_env, "e2e")

    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Kill it once some rollouts are recorded and others are running on the agent server.
    wait_until(lambda: sum(store.exists(k) for k in KEYS) >= 2, timeout=120)
    wait_until(lambda: agent_health(agent_server_process)["running"] >= 1, timeout=30)
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    recorded_before = {r.rollout_key: r.started_at for r in store.records()}
    assert 2 <= len(recorded_before) < len(KEYS)

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]

    records = {r.rollout_key: r for r in store.records()}
    assert sorted(records) == sorted(KEYS)
    for key, record in records.items():
        assert record.status in ENDED, (key, record.reason)
        assert record.rollout_id == f"e2e.{key}.1"  # the first attempt, re-attached if need be
        assert record.reward == record.task["reward"]
        trajectory = record.trajectory
        assert trajectory is not None and len(trajectory.turns) == 1
        turn, sample = trajectory.turns[0], trajectory.samples[0]
        assert sample.prompt_ids == trajectory.prompt_ids(0)
        assert sample.response_ids == turn.completion_ids and all(sample.loss_mask)
        assert sample.logprobs == turn.logprobs and len(turn.completion_ids) <= 8
    # Each rollout ran on the agent server exactly once, across both clients.
    assert agent_health(agent_server_process)["runs_started"] == len(KEYS)
    # Nothing is left registered on the shared gateway.
    assert not [r for r in served.gateway._rollouts if r.startswith("e2e.")]
    # The restarted client left what was recorded before the kill as it was.
    for key, started_at in recorded_before.items():
        assert records[key].started_at == started_at
