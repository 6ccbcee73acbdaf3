"""How `rollway` fails, as an outsider sees it: one `error:` line and a hint, the right exit
code, no traceback unless ROLLWAY_DEBUG=1; and what a run says when nothing completed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

AGENT_SOURCE = """\
from rollway.agents import AgentLoop


class Echo(AgentLoop):
    name = "echo"

    async def run(self, ctx):
        reply = await ctx.chat([{"role": "user", "content": ctx.task["question"]}])
        return ctx.complete([reply.message])
"""


def rollway(
    *args: str, cwd: Path, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "rollway", *args], cwd=cwd, capture_output=True,
        text=True, timeout=120, env={**os.environ, **(env or {})},
    )  # fmt: skip


def assert_one_error(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exit 1, stderr ends with exactly an `error:` line and a `hint:` line, no traceback."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), result.stderr
    assert sum(line.startswith("error: ") for line in lines) == 1
    for text in expected:
        assert text in lines[-2], result.stderr
    return lines[-1]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "echo.py").write_text(AGENT_SOURCE)
    rows = [{"task_id": f"t{i}", "question": f"q{i}"} for i in range(4)]
    (tmp_path / "tasks.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return tmp_path


def test_an_agent_file_with_a_syntax_error_is_one_error_line(workdir: Path) -> None:
    (workdir / "syn.py").write_text("from rollway.agents import AgentLoop\nclass A(AgentLoop)\n")
    ran = rollway("run", "syn.py:A", "--tasks", "tasks.jsonl", "--engine", "sim", cwd=workdir)
    hint = assert_one_error(ran, "syn.py:2", "expected ':'")
    assert "rollway validate" in hint
    checked = rollway("validate", "syn.py:A", cwd=workdir)
    assert_one_error(checked, "syn.py:2")
    debug = rollway("validate", "syn.py:A", cwd=workdir, env={"ROLLWAY_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert "SyntaxError" in debug.stderr


def test_an_agent_class_without_a_name_is_one_error_line_in_run_and_validate(
    workdir: Path,
) -> None:
    (workdir / "noname.py").write_text(AGENT_SOURCE.replace('name = "echo"', "pass"))
    result = rollway("run", "noname.py:Echo", "--tasks", "tasks.jsonl", "--engine", "sim",
                     cwd=workdir)  # fmt: skip
    assert_one_error(result, "noname.py:4", "Echo must set a non-empty `name`")
    # validate reports it as one of the class's problems (the others are checked too).
    checked = rollway("validate", "noname.py:Echo", cwd=workdir)
    assert checked.returncode == 1 and "Traceback" not in checked.stderr, checked.stderr
    assert checked.stdout.splitlines() == [
        "error MISSING_NAME name: the agent has no non-empty `name`"
    ]


def test_an_empty_task_file_is_an_error(workdir: Path) -> None:
    (workdir / "empty.jsonl").write_text("\n\n")
    result = rollway("run", "echo.py:Echo", "--tasks", "empty.jsonl", "--engine", "sim",
                     cwd=workdir)  # fmt: skip
    assert_one_error(result, "empty.jsonl holds no tasks")
    assert not (workdir / "rollway-runs").exists()


def test_a_run_where_no_rollout_completed_exits_1_and_says_why(workdir: Path) -> None:
    (workdir / "score.py").write_text("def score(task, trajectory):\n    raise KeyError('gold')\n")
    result = rollway("run", "echo.py:Echo", "--tasks", "tasks.jsonl", "--engine", "sim",
                     "--reward", "score.py:score", "--out", "runs", cwd=workdir)  # fmt: skip
    hint = assert_one_error(result, "no rollout completed", "4 of 4", "reward")
    assert "KeyError" in hint and "--no-resume" not in hint  # which would sample them again
    command = "rollway rescore runs/echo-tasks --reward score.py:score --failed"
    assert hint.endswith(command)
    summary = orjson.loads((workdir / "runs" / "echo-tasks" / "summary.json").read_bytes())
    assert summary["by_status"] == {"error": 4}  # the summary is still written
    # The reward fixed, the hint's command scores the recorded rollouts, sampling none.
    (workdir / "score.py").write_text("def score(task, trajectory):\n    return 1.0\n")
    rescored = rollway(*command.split()[1:], cwd=workdir)
    assert rescored.returncode == 0, rescored.stderr
    summary = orjson.loads((workdir / "runs" / "echo-tasks" / "summary.json").read_bytes())
    assert summary["by_status"] == {"completed": 4} and summary["mean_reward"] == 1.0


def test_a_run_with_some_completed_rollouts_exits_0_and_names_those_to_rerun(
    workdir: Path,
) -> None:
    (workdir / "flaky.py").write_text(
        AGENT_SOURCE.replace("class Echo", "class Flaky").replace(
            "        reply =",
            "        if ctx.task['task_id'] == 't0':\n"
            "            raise InfrastructureError('sandbox lost')\n"
            "        reply =",
        )
        + "\nfrom rollway.errors import InfrastructureError\n"
    )
    result = rollway("run", "flaky.py:Flaky", "--tasks", "tasks.jsonl", "--engine", "sim",
                     "--out", "runs", cwd=workdir)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "error:" not in result.stderr and "results in runs/echo-tasks" in result.stdout
    assert (
        "warning: 1 of 4 rollouts failed (infrastructure, engine) or were cancelled"
        in result.stderr
    )


def unshare_tmpfs(mountpoint: Path, options: str) -> tuple[str, ...]:
    """A command prefix: run in a private mount namespace where ``mountpoint`` is a fresh tmpfs
    mounted with ``options`` (a real read-only or size-limited filesystem, even as root)."""
    mountpoint.mkdir()
    script = 'mount -t tmpfs -o "$1" rollway-test "$2" && shift 2 && exec "$@"'
    return ("unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh",
            options, str(mountpoint))  # fmt: skip


def test_a_read_only_store_is_one_error_line(workdir: Path) -> None:
    prefix = unshare_tmpfs(workdir / "ro", "ro")
    result = rollway("run", "echo.py:Echo", "--tasks", "tasks.jsonl", "--engine", "sim",
                     "--out", "ro/runs", cwd=workdir, prefix=prefix)  # fmt: skip
    hint = assert_one_error(result, "Read-only file system", "ro/runs")
    assert "--out" in hint


def test_a_full_store_is_one_error_line(workdir: Path) -> None:
    # 16 KiB: room for the config and a record or two, then ENOSPC mid-batch.
    rows = [{"task_id": f"t{i}", "question": "x" * 2000} for i in range(12)]
    (workdir / "big.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    prefix = unshare_tmpfs(workdir / "full", "size=16k")
    result = rollway("run", "echo.py:Echo", "--tasks", "big.jsonl", "--engine", "sim",
                     "--out", "full/runs", cwd=workdir, prefix=prefix)  # fmt: skip
    hint = assert_one_error(result, "No space left on device", "full/runs/echo-big")
    assert "free space" in hint
