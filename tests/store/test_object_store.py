"""The object store against a real S3-protocol server (moto's standalone server) on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import RolloutRecord
from rollway.store import export_records, store_from_uri
from rollway.store.object_store import ObjectStore
from tests.client.conftest import ScriptedAgent


def record(key: str, reward: float) -> RolloutRecord:
    return RolloutRecord(
        exp_id="exp", rollout_key=key, rollout_id=f"exp.{key}.1", task_index=0, group_id="exp:t",
        group_index=0, sample_index=0, status="completed", reward=reward,
        started_at=time.time(), elapsed_s=0.1,
    )  # fmt: skip


def test_records_round_trip_and_list_in_object_storage(s3_env: str) -> None:
    store = store_from_uri(s3_env, "exp")
    assert isinstance(store, ObjectStore)
    assert store.get("t.0") is None and not store.exists("t.0") and store.keys() == set()
    store.write_config({"agent": "a"})
    store.write(record("t.0", 1.0))
    store.write(record("t.1", 0.0))
    store.write(record("t.0", 0.5))  # a rewrite replaces the whole object
    assert store.exists("t.0") and store.get("t.0").reward == 0.5
    assert [r.rollout_key for r in store.records()] == ["t.0", "t.1"]
    assert store.keys() == {"t.0", "t.1"}
    again = store_from_uri(s3_env, "exp")  # another process sees the same experiment
    assert [r.reward for r in again.records()] == [0.5, 0.0]


def test_a_batch_resumes_from_object_storage_and_exports(
    s3_env: str, renderer: ChatRenderer, tmp_path: Path
) -> None:
    tasks = [{"task_id": f"s{i}", "reward": 1.0} for i in range(3)]

    def client() -> RolloutClient:
        gateway = Gateway(SimEngine(SimConfig()), renderer, model_name="sim")
        return RolloutClient(ScriptedAgent, gateway, store=s3_env, exp_id="batch")

    with client() as first:
        assert len(list(first.run_batch(tasks, group_size=2))) == 6
    ScriptedAgent.starts = []
    with client() as second:
        items = list(second.run_batch(tasks, group_size=2))
    assert len(items) == 6 and all(i.from_store for i in items) and ScriptedAgent.starts == []
    out = tmp_path / "samples.parquet"
    assert export_records(second.store.records(), out, "parquet") == 6
    assert {r["group_id"] for r in pq.read_table(out).to_pylist()} == {
        f"batch:s{i}" for i in range(3)
    }


def test_rollway_run_writes_to_object_storage(s3_env: str, tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "calculator"
    result = subprocess.run(
        [sys.executable, "-m", "rollway", "run", f"{example}/agent.py:CalculatorAgent",
         "--tasks", f"{example}/tasks.jsonl", "--limit", "2", "--engine", "sim", "--out", s3_env],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"results in {s3_env}/calculator-tasks" in result.stdout
    stored = list(store_from_uri(s3_env, "calculator-tasks").records())
    assert len(stored) == 2 and all(r.trajectory is not None for r in stored)


def test_rollway_rescore_rescores_a_run_in_object_storage(
    s3_env: str, renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = Gateway(SimEngine(SimConfig()), renderer, model_name="sim")
    tasks = [{"task_id": f"s{i}", "reward": 1.0} for i in range(2)]
    with RolloutClient(ScriptedAgent, gateway, store=s3_env, exp_id="scored") as client:
        list(client.run_batch(tasks, group_size=2))
    (tmp_path / "grader.py").write_text("def half(task, trajectory):\n    return 0.5\n")
    result = subprocess.run(
        [sys.executable, "-m", "rollway", "rescore", f"{s3_env}/scored", "--reward",
         "grader.py:half"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "rescored 4 rollouts" in result.stdout
    store = store_from_uri(s3_env, "scored")
    assert [(r.reward, r.reward_history[0].reward) for r in store.records()] == [(0.5, 1.0)] * 4
    summary = store.read_summary("summary")
    assert summary is not None and summary["mean_reward"] == 0.5
    groups = store.read_summary("groups")
    assert groups is not None and [g["mean_reward"] for g in groups["groups"]] == [0.5, 0.5]
