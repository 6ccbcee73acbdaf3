"""benchmarks/peers.py in its shortest form: every system serves every conversation, and the
report has its rows (the full run is `make bench`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.peers import Shape

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"


def test_tool_results_are_seeded_and_as_long_as_asked() -> None:
    shape = Shape(turns=3, tool_result_words=7)
    assert shape.tool_result(2, 1) == shape.tool_result(2, 1)
    assert shape.tool_result(2, 1) != shape.tool_result(3, 1)
    assert len(shape.tool_result(0, 0).split()) == 2 + 7  # "fact 0" and the words
    assert Shape().tool_result(0, 4) == "fact 4"


def test_a_short_run_serves_every_conversation_through_every_system() -> None:
    cmd = [sys.executable, str(SCRIPT), "--quick", "--skip-litellm", "--reps", "1"]
    cmd += ["--concurrency", "4", "--turns", "3", "--tool-result-words", "20"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    table = run.stdout.split("concurrency 4 (10 conversations x 3 turns per run):")[1]
    for system in ("direct", "bare proxy", "rollway", "rollway (sim)"):
        row = re.search(rf"^  {re.escape(system)}\s+(\d+) \(.*\s(\d+)$", table, re.MULTILINE)
        assert row is not None, f"no row for {system}:\n{table}"
        turns_per_s, failed = int(row.group(1)), int(row.group(2))
        assert turns_per_s > 0 and failed == 0, row.group(0)
