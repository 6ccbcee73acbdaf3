"""``rollway run --tasks reasoning-gym:...`` as a real subprocess, with no agent named: the
built-in question agent asks, the scripted engine answers, and the dataset's own scorer gives
the reward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from rollway.client.reasoning_gym_source import reasoning_gym_tasks

SPEC = "reasoning-gym:leg_counting?size=2&seed=11"


def rollway(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollway", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_run_without_an_agent_scores_reasoning_gym_tasks_by_their_dataset(
    tmp_path: Path,
) -> None:
    rows = reasoning_gym_tasks(SPEC)
    script = tmp_path / "answers.json"
    script.write_bytes(orjson.dumps([f"<answer>{row['answer']}</answer>" for row in rows]))
    # One at a time: the scripted engine answers in call order, the tasks' order.
    ran = rollway(
        "run", "--tasks", SPEC, "--engine", f"scripted://{script}", "--concurrency", "1",
        "--out", "runs", cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "results in runs/question-leg_counting" in ran.stdout
    paths = (tmp_path / "runs" / "question-leg_counting" / "trajectories").glob("*.json")
    records = sorted((orjson.loads(p.read_bytes()) for p in paths), key=lambda r: r["task_index"])
    assert [r["task"]["task_id"] for r in records] == [row["task_id"] for row in rows]
    assert [r["reward"] for r in records] == [1.0, 1.0]
    assert all(r["reward_info"]["scorer"] == "reasoning_gym:leg_counting" for r in records)
    assert all(r["reward_info"]["source"] == "task_scorer" for r in records)


def test_run_refuses_an_unknown_dataset_naming_the_close_ones(tmp_path: Path) -> None:
    ran = rollway("run", "--tasks", "reasoning-gym:leg_count", "--engine", "sim", cwd=tmp_path)
    assert ran.returncode == 1
    assert "reasoning-gym has no dataset 'leg_count'; close names: leg_counting" in ran.stderr
