"""`rollway run`'s rollout settings as an outsider sees them: the per-rollout timeout (900 s
unless told, 0 for none) and status lines on a timer while a batch is stuck."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.cli.test_run_failures import rollway

AGENTS = """\
import asyncio

from rollway.agents import AgentLoop


class Hang(AgentLoop):
    name = "hang"

    async def run(self, ctx):
        await asyncio.sleep(3600)


class Quick(AgentLoop):
    name = "quick"

    async def run(self, ctx):
        return ctx.complete([])
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(AGENTS)
    (tmp_path / "tasks.jsonl").write_text('{"task_id": "t"}\n')
    return tmp_path


def run(workdir: Path, agent: str, *flags: str) -> tuple[str, dict]:
    ran = rollway(
        "run", f"agents.py:{agent}", "--tasks", "tasks.jsonl", "--engine", "sim",
        "--out", "runs", *flags, cwd=workdir,
    )  # fmt: skip
    config = orjson.loads(
        (workdir / "runs" / f"{agent.lower()}-tasks" / "config.json").read_bytes()
    )
    return ran.stderr, config


def test_a_stuck_run_reports_status_lines_on_a_timer(workdir: Path) -> None:
    stderr, config = run(workdir, "Hang", "--timeout", "1.5", "--status-interval", "0.2")
    stuck = [line for line in stderr.splitlines() if "batch status: 0/1 done" in line]
    assert len(stuck) >= 2, stderr
    record = orjson.loads(
        (workdir / "runs" / "hang-tasks" / "trajectories" / "t.0.json").read_bytes()
    )
    assert record["status"] == "timeout"
    assert config["limits"]["timeout"] == 1.5 and config["status_interval"] == 0.2


def test_timeout_0_means_no_limit(workdir: Path) -> None:
    _, config = run(workdir, "Quick", "--timeout", "0")
    assert config["limits"]["timeout"] is None


def test_a_stuck_rollout_is_reported_in_status_lines_and_aborted_by_flag(workdir: Path) -> None:
    stderr, _ = run(
        workdir, "Hang", "--timeout", "1.5", "--stuck-after", "0.3", "--status-interval", "0.1"
    )
    assert "| 1 stuck" in stderr and "in its agent (no model call pending)" in stderr, stderr
    trajectory = workdir / "runs" / "hang-tasks" / "trajectories" / "t.0.json"
    assert orjson.loads(trajectory.read_bytes())["status"] == "timeout"
    trajectory.unlink()  # the rerun below runs it again
    run(workdir, "Hang", "--stuck-after", "0.3", "--abort-stuck", "--no-resume")
    record = orjson.loads(trajectory.read_bytes())
    assert record["status"] == "timeout"
    assert record["reason"].startswith("stuck: no progress for")
    assert record["reason"].endswith("in its agent (no model call pending)")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--workers-per-node", "2"], "--workers-per-node goes with --executor ray"),
        (["--workers", "2", "--ray-address", "auto"], "--ray-address and --workers go with"),
        (
            ["--executor", "ray", "--workers", "2", "--workers-per-node", "1"],
            "give --workers or --workers-per-node, not both",
        ),
    ],
)
def test_the_ray_options_are_refused_without_the_ray_executor_naming_them(
    workdir: Path, flags: list[str], said: str
) -> None:
    ran = rollway(
        "run", "agents.py:Quick", "--tasks", "tasks.jsonl", "--engine", "sim", "--out", "runs",
        *flags, cwd=workdir,
    )  # fmt: skip
    assert ran.returncode != 0 and said in ran.stderr, ran.stderr
    assert not (workdir / "runs").exists()  # refused before anything ran


def test_workers_per_node_is_a_config_key_refused_there_too_without_ray(workdir: Path) -> None:
    (workdir / "run.toml").write_text("workers_per_node = 2\n")
    shown = rollway("run", "--config", "run.toml", "--print-config", cwd=workdir)
    assert shown.returncode == 0 and "workers_per_node = 2" in shown.stdout.splitlines()
    ran = rollway(
        "run", "agents.py:Quick", "--tasks", "tasks.jsonl", "--engine", "sim", "--out", "runs",
        "--config", "run.toml", cwd=workdir,
    )  # fmt: skip
    assert ran.returncode != 0 and "--workers-per-node goes with --executor ray" in ran.stderr
