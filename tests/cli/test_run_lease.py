"""`rollway run` on an experiment another live client runs: refused before it starts anything,
with one error line naming that client, and a hint."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from rollway.leases import Lease, LeaseHolder
from rollway.store import store_from_uri
from tests.cli.test_run_failures import AGENT_SOURCE, assert_one_error, rollway


def test_a_second_run_on_the_same_out_folder_is_refused_naming_the_first(tmp_path: Path) -> None:
    workdir = tmp_path
    (workdir / "echo.py").write_text(AGENT_SOURCE)
    (workdir / "tasks.jsonl").write_text('{"task_id": "t0", "question": "q0"}\n')
    store = store_from_uri(str(workdir / "runs"), "calc")
    first = LeaseHolder.this_process()  # what a running client holds
    store.take_lease(Lease(exp_id="calc", holder=first, renewed_at=time.time(), ttl_s=30.0))
    try:
        ran = rollway(
            "run", "echo.py:Echo", "--tasks", "tasks.jsonl", "--engine", "sim",
            "--out", "runs", "--exp-id", "calc", cwd=workdir,
        )  # fmt: skip
    finally:
        store.release_lease(first)
    hint = assert_one_error(
        ran, "experiment 'calc' is in use by another client",
        f"pid {os.getpid()} on {socket.gethostname()}, started ", first.id[:8],
    )  # fmt: skip
    assert "--exp-id" in hint
    assert not list((workdir / "runs" / "calc" / "trajectories").iterdir())


def test_a_run_on_a_broken_lease_file_names_it_and_says_to_remove_it(tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(AGENT_SOURCE)
    (tmp_path / "tasks.jsonl").write_text('{"task_id": "t0", "question": "q0"}\n')
    lease = tmp_path / "runs" / "calc" / "lease.json"
    lease.parent.mkdir(parents=True)
    lease.write_text("")  # an empty lease: a hand edit, a tool that truncated it
    ran = rollway(
        "run", "echo.py:Echo", "--tasks", "tasks.jsonl", "--engine", "sim",
        "--out", "runs", "--exp-id", "calc", cwd=tmp_path,
    )  # fmt: skip
    hint = assert_one_error(ran, f"lease {lease} cannot be read", f"remove {lease} if no run")
    assert "bug" not in ran.stderr and "names the file" in hint
