"""In a batch of program agents, a sandbox supervisor killed from outside is an infrastructure
failure naming the supervisor (retried like one, never the policy's error), while a program
killed by a signal, from outside or by itself, stays the agent's error. Both sandboxes."""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollway.agents.program import ProgramAgent
from rollway.client import RolloutClient
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.sandbox import LocalSandbox, NamespaceSandbox, SandboxLimits

from ..sandbox.test_local import is_gone
from ..sandbox.test_supervisor_death import children, tree
from .test_program import sim_gateway

# The victim waits (once it said so) until its gate exists: the retry after the kill finds it.
PROGRAM = [
    sys.executable,
    "-c",
    """
import json, os, signal, sys, time
task = json.load(sys.stdin)
if task["role"] == "self":
    os.kill(os.getpid(), signal.SIGKILL)
if task["role"] in ("supervisor", "program") and not os.path.exists(task["gate"]):
    open("waiting", "w").close()
    time.sleep(120)
json.dump({"reward": 0.5}, open(os.environ["ROLLWAY_RESULT_FILE"], "w"))
""",
]


def supervisors() -> list[int]:
    """Every sandbox supervisor running now (not the namespace sandbox's unshare)."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            args = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args[0] != b"unshare" and any(a.endswith(b"/supervisor.py") for a in args[:4]):
            found.append(int(entry.name))
    return found


def waiting_supervisor() -> int:
    """The supervisor whose program said it waits (found through its ``ROLLWAY_TASK_FILE``)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for pid in supervisors():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            task_files = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"ROLLWAY_TASK_")]
            if task_files and (Path(os.fsdecode(task_files[0])).parent / "waiting").exists():
                return pid
        time.sleep(0.02)  # a poll with a deadline
    raise AssertionError("no program said it waits")


def kill_the_victim(target: str, gate: Path) -> list[int]:
    """SIGKILL the waiting program's supervisor (or the program); its processes before."""
    supervisor = waiting_supervisor()
    processes = tree(supervisor)
    gate.touch()  # the next attempt goes through
    os.kill(supervisor if target == "supervisor" else children(supervisor)[0], signal.SIGKILL)
    return processes


@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("sandbox", [LocalSandbox, NamespaceSandbox])
@pytest.mark.parametrize(
    ("victim", "attempts", "expected"),
    [
        ("supervisor", 3, ("completed", None, 2)),  # retried, then it goes through
        ("supervisor", 1, ("error", "infrastructure", 1)),  # no retry left: recorded as such
        ("program", 3, ("error", "agent", 1)),  # killed from outside
        ("self", 3, ("error", "agent", 1)),  # killed itself
    ],
)
def test_a_killed_supervisor_is_infrastructure_and_a_killed_program_the_agents_error(
    renderer: ChatRenderer,
    tmp_path: Path,
    sandbox: type[LocalSandbox],
    victim: str,
    attempts: int,
    expected: tuple[str, str | None, int],
) -> None:
    """Before, a killed supervisor was the agent's error: ``program exited with -9`` (local),
    ``program exited with 1: unshare: sigprocmask unblock failed`` (namespace)."""
    gate = tmp_path / "gate" / "open"
    gate.parent.mkdir()
    limits = SandboxLimits(writable_paths=(str(gate.parent),))  # seen inside a namespace
    agent = ProgramAgent(PROGRAM, limits=limits, sandbox=sandbox)
    tasks = [{"task_id": "victim", "role": victim, "gate": str(gate)}]
    tasks += [{"task_id": f"good{i}", "role": "good", "gate": ""} for i in range(2)]
    settings = {"timeout": 120, "max_retry_attempts": attempts, "store": str(tmp_path / "runs")}
    with (
        RolloutClient(agent, sim_gateway(renderer), **settings) as client,
        ThreadPoolExecutor() as pool,
    ):
        killed = pool.submit(kill_the_victim, victim, gate) if victim != "self" else None
        items = list(client.run_batch(tasks))  # it runs as it is read
        processes = killed.result(timeout=60) if killed is not None else []
        stored = list(client.store.records())
    results = {tasks[item.index]["task_id"]: item.result for item in items}
    record = results.pop("victim")
    assert (record.status, record.error_kind, record.attempts) == expected, record.reason
    if expected[1] == "infrastructure":
        assert "supervisor" in record.reason and "exit status" in record.reason
    if expected[1] == "agent":
        assert "program exited with -9" in record.reason
    others = [(r.status, r.reward, r.attempts) for r in results.values()]
    assert others == [("completed", 0.5, 1)] * 2
    assert len(items) == len(stored) == 3  # nothing lost, nothing twice
    assert all(is_gone(pid) for pid in processes)
