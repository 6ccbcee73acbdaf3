"""Rescoring a recorded run: new rewards over the stored trajectories, no rollout run again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollway import ConfigError, ExperimentInUseError, Judge, Rubric
from rollway.client import RolloutClient
from rollway.client.rescore import rescore
from rollway.gateway.handle import GatewayHandle, LocalGateway
from rollway.leases import Lease, LeaseHolder
from rollway.store import export_records
from rollway.trajectory import Trajectory
from tests.agents.server.fixtures import wait_until
from tests.client.conftest import ScriptedAgent

MakeClient = Callable[..., RolloutClient]

GRADER = """
import asyncio
import pathlib

from rollway import Judge

policy_judge = Judge()

def broken(task, trajectory):
    raise ConnectionError("grader down")

async def stalls(task, trajectory):
    if task["task_id"] == "g1":
        pathlib.Path("stalled").touch()
        await asyncio.sleep(120)
    return 1.0

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


def test_a_rescore_that_fails_is_noted_and_tried_again_next_time(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = broken_run(make_client, tmp_path)
    from grader import broken

    before = client.store.get("g0.0")
    report = client.rescore(broken)
    assert (report.scored, report.failed) == (0, 4)
    record = client.store.get("g0.0")
    # Left as it was (its reason the run's), the failed rescore noted beside.
    assert (record.error_kind, record.reason, record.reward_history) == (
        "reward", before.reason, []
    )  # fmt: skip
    failure = record.reward_info["rescore_failed"]
    assert failure["reward_fn"] == "grader:broken" and "grader down" in failure["reason"]
    assert len(failure["tries"]) == 1  # the client's limits: reward_retries=0
    assert client.rescore(broken, failed_only=True).failed == 4  # a failure is tried again
    replaced = client.rescore(broken, failed_only=True, replace_on_failure=True)
    assert replaced.failed == 4 and len(client.store.get("g0.0").reward_history) == 1


def test_a_failed_rescore_never_replaces_a_good_reward_unless_asked(
    make_client: MakeClient, tmp_path: Path
) -> None:
    sys.path.insert(0, str(tmp_path))
    (tmp_path / "grader.py").write_text(GRADER)
    from grader import broken

    client = make_client(exp_id="good", reward_retries=0)
    list(client.run_batch([{"task_id": f"k{i}", "reward": 0.5} for i in range(3)]))
    summary_before = orjson.loads((client.store.path / "summary.json").read_bytes())
    report = client.rescore(broken)
    assert (report.chosen, report.scored, report.failed) == (3, 0, 3)
    assert report.reasons == {"reward function raised ConnectionError: grader down": 3}
    for record in client.store.records():
        assert (record.status, record.reward, record.reward_history) == ("completed", 0.5, [])
        assert record.reward_info["source"] == "agent"  # the reward still current
        assert "grader down" in record.reward_info["rescore_failed"]["reason"]
        assert record.reward_components == {}
    summary = orjson.loads((client.store.path / "summary.json").read_bytes())
    assert summary["by_status"] == summary_before["by_status"] == {"completed": 3}
    assert summary["mean_reward"] == 0.5 and summary["rescored"]["failed"] == 3
    # Asked, the failure is the record's outcome; the good reward goes to its history.
    assert client.rescore(broken, replace_on_failure=True).failed == 3
    record = client.store.get("k0.0")
    assert (record.status, record.error_kind, record.reward) == ("error", "reward", None)
    assert record.reward_history[0].reward == 0.5
    summary = orjson.loads((client.store.path / "summary.json").read_bytes())
    assert summary["by_status"] == {"error": 3}


def test_a_judge_of_the_policys_engine_is_refused_before_any_record_is_read(
    make_client: MakeClient,
) -> None:
    client = make_client(exp_id="judged")
    list(client.run_batch([{"task_id": "j", "reward": 1.0}]))
    files = {p: p.read_bytes() for p in client.store.path.rglob("*.json")}
    for reward in (Judge(), Rubric({"judge": Judge(), "one": lambda task, trajectory: 1.0})):
        with pytest.raises(ConfigError, match=r"Judge with no engine of its own \(engine=None\)"):
            rescore(client.store, reward)
    assert {p: p.read_bytes() for p in client.store.path.rglob("*.json")} == files
    assert client.rescore(Judge(parse=lambda answer: 0.25)).scored == 1  # a client lends one


def test_a_judge_whose_engine_is_down_names_the_generate_and_closes_its_session(
    make_client: MakeClient,
) -> None:
    client = make_client(exp_id="down", reward_retries=0)
    list(client.run_batch([{"task_id": "d", "reward": 1.0}]))
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    built: list[GatewayHandle] = []

    class Watched(Judge):
        def _build(self) -> GatewayHandle:
            built.append(super()._build())
            return built[-1]

    report = rescore(client.store, Watched(engine=f"sglang://127.0.0.1:{port}"))
    (own,) = built
    assert isinstance(own, LocalGateway)
    session = own.gateway.engine.http._session  # type: ignore[attr-defined]
    assert session is not None and session.closed  # closed by the rescore that opened it
    ((reason, _),) = report.reasons.items()
    assert f"cannot connect to http://127.0.0.1:{port}/generate" in reason, reason
    assert "abort_request" not in reason
    assert client.store.get("d.0").reward == 1.0


def misalign(path: Path) -> None:
    """Drop a logprob from the record's first turn: its tokens and logprobs no longer pair."""
    data = orjson.loads(path.read_bytes())
    data["trajectory"]["turns"][0]["logprobs"].pop()
    path.write_bytes(orjson.dumps(data))


def test_a_record_export_would_refuse_is_a_bad_record_left_as_it_is(
    make_client: MakeClient,
) -> None:
    client = make_client(exp_id="aligned")
    list(client.run_batch([{"task_id": f"a{i}", "reward": 0.5} for i in range(2)]))
    path = client.store.path / "trajectories" / "a0.0.json"
    misalign(path)
    edited = path.read_bytes()
    report = rescore(client.store, lambda task, trajectory: 1.0)
    assert (report.scored, report.skipped) == (1, 0)
    (bad,) = report.bad
    assert "a0.0" in str(bad) and "logprobs" in str(bad)
    assert path.read_bytes() == edited
    assert client.store.get("a1.0").reward == 1.0


def test_a_rescore_holds_the_experiment_and_never_writes_over_a_newer_record(
    make_client: MakeClient,
) -> None:
    client = make_client(exp_id="leased")
    list(client.run_batch([{"task_id": f"l{i}", "reward": 0.5} for i in range(2)]))
    refused: list[str] = []

    def meanwhile(task: dict[str, Any], trajectory: Trajectory) -> float:
        """While the rescore runs, a client's batch is refused; a writer that ignores the
        lease stores a new rollout of l0 under its key."""
        if task["task_id"] == "l0":
            try:
                list(client.run_batch([{"task_id": "l0", "reward": 0.9}], resume=False))
            except ExperimentInUseError as exc:
                refused.append(str(exc))
            newer = client.store.get("l0.0").model_copy(update={"run_id": "newer", "reward": 0.9})
            client.store.write(newer)
        return 1.0

    report = rescore(client.store, meanwhile, concurrency=1)
    assert len(refused) == 1 and "in use by another client" in refused[0]
    assert (report.scored, report.changed) == (1, 1)
    kept = client.store.get("l0.0")
    assert (kept.run_id, kept.reward, kept.reward_history) == ("newer", 0.9, [])
    assert client.store.get("l1.0").reward == 1.0
    summary = orjson.loads((client.store.path / "summary.json").read_bytes())
    assert summary["mean_reward"] == pytest.approx(0.95)  # of the records as they are now
    assert not (client.store.path / "lease.json").exists()  # given back
    # While another client holds it, a rescore is refused before reading a record.
    other = Lease(exp_id="leased", holder=LeaseHolder.this_process(), renewed_at=time.time(),
                  ttl_s=30.0)  # fmt: skip
    client.store.take_lease(other)
    with pytest.raises(ExperimentInUseError):
        rescore(client.store, meanwhile)
    client.store.release_lease(other.holder)


def test_ctrl_c_says_how_far_a_rescore_got_and_a_rerun_goes_on(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = broken_run(make_client, tmp_path)
    run = client.store.path
    command = [sys.executable, "-m", "rollway", "rescore", str(run), "--reward",
               "grader.py:stalls", "--concurrency", "1"]  # fmt: skip
    with subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            wait_until(lambda: (tmp_path / "stalled").exists() or process.poll() is not None, 120)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=60)
        finally:
            process.kill()
    assert process.returncode == 130, err
    assert (
        "interrupted: 2 of 4 rollouts rescored with rollway_agent_grader:stalls; run the same "
        "command again to go on from there"
    ) in err
    summary = orjson.loads((run / "summary.json").read_bytes())
    assert summary["rescored"]["interrupted"] and summary["rescored"]["scored"] == 2
    assert summary["by_status"] == {"completed": 2, "error": 2}  # of what was written
    assert [client.store.get(f"g0.{i}").reward for i in range(2)] == [1.0, 1.0]
    assert not (run / "lease.json").exists()  # given back


def test_rollway_rescore_refuses_a_held_experiment_and_a_judge_it_cannot_run(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = broken_run(make_client, tmp_path)
    run = client.store.path
    files = {p: p.read_bytes() for p in (run / "trajectories").iterdir()}
    judged = rollway("rescore", str(run), "--reward", "grader.py:policy_judge", cwd=tmp_path)
    assert judged.returncode == 1 and "Traceback" not in judged.stderr
    assert "error: the reward holds a Judge with no engine of its own" in judged.stderr
    holder = LeaseHolder.this_process()  # a live client: this process
    client.store.take_lease(Lease(exp_id="graded", holder=holder, renewed_at=time.time(),
                                  ttl_s=30.0))  # fmt: skip
    try:
        held = rollway("rescore", str(run), "--reward", "grader.py:turns", cwd=tmp_path)
    finally:
        client.store.release_lease(holder)
    assert held.returncode == 1 and "Traceback" not in held.stderr
    assert "error: experiment 'graded' is in use by another client" in held.stderr
    assert "hint: rescore once that client has ended" in held.stderr
    assert {p: p.read_bytes() for p in (run / "trajectories").iterdir()} == files
