"""Rescoring a recorded run: new rewards over the stored trajectories, no rollout run again."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from rollway import Rubric
from rollway.client import RolloutClient
from rollway.client.rescore import rescore
from rollway.store import export_records
from rollway.trajectory import Trajectory
from tests.client.conftest import ScriptedAgent

MakeClient = Callable[..., RolloutClient]

GRADER = """
def broken(task, trajectory):
    raise ConnectionError("grader down")

def turns(task, trajectory):
    return {"reward": float(len(trajectory.turns)), "turns": len(trajectory.turns)}
"""


def rollway(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollway", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120, env=dict(os.environ),
    )  # fmt: skip


def broken_run(make_client: MakeClient, tmp_path: Path) -> RolloutClient:
    """A run of 4 rollouts whose grader failed every try: all ``error/reward``."""
    sys.path.insert(0, str(tmp_path))
    (tmp_path / "grader.py").write_text(GRADER)
    from grader import broken  # type: ignore[import-not-found]

    client = make_client(exp_id="graded", reward=broken, reward_retries=0)
    tasks = [{"task_id": f"g{i}", "chats": 1 + i % 2} for i in range(2)]
    items = list(client.run_batch(tasks, group_size=2))
    assert {(i.result.status, i.result.error_kind) for i in items} == {("error", "reward")}
    return client


def test_rollway_rescore_scores_the_failed_rollouts_without_running_one(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = broken_run(make_client, tmp_path)
    before = {r.rollout_key: r for r in client.store.records()}
    starts = len(ScriptedAgent.starts)
    run = client.store.path
    (run / "trajectories" / "cut.0.json").write_text('{"exp_id": ')  # a bad record
    done = rollway("rescore", str(run), "--reward", "grader.py:turns", "--failed", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rescored 4 rollouts with rollway_agent_grader:turns" in done.stdout
    assert "1 bad records skipped" in done.stdout and "cut.0.json" in done.stderr
    assert len(ScriptedAgent.starts) == starts  # no rollout ran
    for record in client.store.records(on_bad=lambda error: None):
        old = before[record.rollout_key]
        assert (record.status, record.error_kind, record.reason) == ("completed", None, None)
        assert record.reward == len(record.trajectory.turns)
        assert record.reward_info["turns"] == len(record.trajectory.turns)
        assert record.reward_info["reward_fn"] == "rollway_agent_grader:turns"
        assert record.trajectory == old.trajectory and record.rollout_id == old.rollout_id
        (past,) = record.reward_history  # the old scoring, beside the new one
        assert (past.status, past.error_kind, past.reward) == ("error", "reward", None)
        assert past.reason == old.reason and past.reward_fn == "grader:broken"
        assert record.fingerprint["reward"] == "rollway_agent_grader:turns"
    groups = orjson.loads((run / "groups.json").read_bytes())["groups"]
    assert sorted(g["mean_reward"] for g in groups) == [1.0, 2.0]
    summary = orjson.loads((run / "summary.json").read_bytes())
    assert summary["by_status"] == {"completed": 4} and summary["mean_reward"] == 1.5
    assert summary["errors_by_kind"] == {} and summary["rescored"]["scored"] == 4
    assert "tokens_per_s" in summary  # the run's own figures are kept
    out = tmp_path / "rows.jsonl"
    export_records(client.store.records(on_bad=lambda error: None), out, "jsonl")
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(row["reward"] for row in rows) == [1.0, 1.0, 2.0, 2.0]
    # Run again, it finds nothing left to do: a rescore cut short goes on where it stopped.
    again = rollway("rescore", str(run), "--reward", "grader.py:turns", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "rescored 0 rollouts" in again.stdout and "4 left as they were" in again.stdout


def test_client_rescore_gives_every_scored_record_new_components(make_client: MakeClient) -> None:
    tasks = [{"task_id": f"c{i}", "reward": 0.5} for i in range(3)]
    client = make_client(exp_id="components")
    list(client.run_batch(tasks))

    def long(task: dict[str, Any], trajectory: Trajectory) -> float:
        return float(len(trajectory.messages))

    report = client.rescore(Rubric({"long": long, "one": lambda task, trajectory: 1.0}))
    assert (report.scored, report.failed, report.skipped) == (3, 0, 0)
    for record in client.store.records():
        assert record.reward == record.reward_info["long"] + 1.0
        assert record.reward_info["one"] == 1.0 and record.reward_info["source"] == "reward_fn"
        assert record.reward_history[0].reward == 0.5
        assert record.reward_history[0].reward_fn == "agent"
    assert rescore(client.store, long, again=True).scored == 3  # by the function again


def test_a_rescore_that_fails_is_recorded_and_tried_again_next_time(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = broken_run(make_client, tmp_path)
    from grader import broken

    report = client.rescore(broken)
    assert (report.scored, report.failed) == (0, 4)
    record = client.store.get("g0.0")
    assert record.error_kind == "reward" and len(record.reward_history) == 1
    assert len(record.reward_info["tries"]) == 1  # the client's limits: reward_retries=0
    assert client.rescore(broken, failed_only=True).failed == 4  # a failure is tried again
    assert len(client.store.get("g0.0").reward_history) == 2
