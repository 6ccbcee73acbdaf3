"""Ctrl-C, or a SIGTERM (how Slurm, Kubernetes and `ray job stop` end a job), in the middle of
`rollway run`: it says what happened, writes the summary of what finished, releases the
experiment's lease, exits 130 (143 for the SIGTERM); a rerun resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.cli.test_run_failures import AGENT_SOURCE


def _default_sigint() -> None:
    """Ctrl-C as a terminal gives it: a suite started in the background (``pytest &`` in a
    script) has SIGINT ignored, children inherit that, and Python then never sees the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("signum", "status", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stop_mid_batch_reports_writes_the_summary_and_a_rerun_resumes(
    tmp_path: Path, signum: signal.Signals, status: int, said: str
) -> None:
    (tmp_path / "echo.py").write_text(AGENT_SOURCE)
    rows = [{"task_id": f"t{i}", "question": f"q{i}"} for i in range(12)]
    (tmp_path / "tasks.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    args = [sys.executable, "-m", "rollway", "run", "echo.py:Echo", "--tasks", "tasks.jsonl",
            "--concurrency", "2", "--out", "runs"]  # fmt: skip
    trajectories = tmp_path / "runs" / "echo-tasks" / "trajectories"
    slow = subprocess.Popen(
        [*args, "--engine", "sim://?latency_s=0.4"], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint,
    )  # fmt: skip
    with slow:
        deadline = time.monotonic() + 60
        # Mid-batch: three records written, so the first pair's (which end together) at least
        # 0.4 s ago. A rollout written as it ended but not yet handed back when Ctrl-C comes
        # is rewritten as cancelled (client/future.py).
        while len(list(trajectories.glob("*.json"))) < 3:
            assert slow.poll() is None and time.monotonic() < deadline, slow.communicate()
            time.sleep(0.05)
        slow.send_signal(signum)
        out, err = slow.communicate(timeout=60)
    assert slow.returncode == status, err
    assert "Traceback" not in err and "Aborted" not in err and "results in" not in out
    records = [orjson.loads(p.read_bytes()) for p in trajectories.glob("*.json")]
    recorded = sum(r["status"] != "cancelled" for r in records)
    cancelled = sum(r["status"] == "cancelled" for r in records)
    assert recorded >= 2 and recorded + cancelled == 12 and cancelled > 0
    assert f"{said}: {recorded} recorded, {cancelled} cancelled; rerun to resume" in err
    assert not (tmp_path / "runs" / "echo-tasks" / "lease.json").exists()
    summary = orjson.loads((tmp_path / "runs" / "echo-tasks" / "summary.json").read_bytes())
    assert summary["by_status"] == {"completed": recorded, "cancelled": cancelled}
    assert summary["interrupted"] is True
    again = subprocess.run(
        [*args, "--engine", "sim"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=os.environ,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    summary = orjson.loads((tmp_path / "runs" / "echo-tasks" / "summary.json").read_bytes())
    assert summary["by_status"] == {"completed": 12} and summary["resumed"] == recorded
    assert summary["interrupted"] is False
