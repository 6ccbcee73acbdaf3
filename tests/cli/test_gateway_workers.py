"""`rollway gateway --workers 2` as real subprocesses on loopback: each rollout's turns reach
the one worker that holds it (straight at its port, as its registration answers), weight
updates reach every worker (a restarted one too), and a worker that dies is started again
while its rollouts fail as infrastructure, the others go on."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rollway.client import RolloutClient
from rollway.errors import ExperimentInUseError, InfrastructureError, UnknownRolloutError
from rollway.gateway import RemoteGateway
from rollway.gateway.request_schema import RegisterRequest
from rollway.gateway.weight_control import NewWeights
from rollway.gateway.workers.worker_pool import worker_index
from rollway.leases import LeaseHolder
from tests.cli.test_gateway_command import free_port
from tests.cli.test_gateway_rollout_ttl import wait_until_serving
from tests.client.test_gateway_faults import ROLLOUTS, FaultAgent

ADMIN_KEY = "ak-workers-test"
WORKERS = 2


def on_worker(index: int, prefix: str) -> str:
    """A rollout id the front routes to worker ``index`` (its stable hash)."""
    return next(f"{prefix}{n}" for n in range(100) if worker_index(f"{prefix}{n}", 2) == index)


def start_front(*options: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """`rollway gateway --engine sim --workers 2` (and ``options``) on a free port, serving;
    ``env`` adds to the environment (the admin key is ``ADMIN_KEY``)."""
    port = free_port()
    environment = {**os.environ, "ROLLWAY_ADMIN_KEY": ADMIN_KEY, **env}
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", "sim", "--port", str(port),
           "--workers", str(WORKERS), *options]  # fmt: skip
    proc = subprocess.Popen(cmd, env=environment, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url) as client:
            wait_until_serving(proc, client)
    except BaseException:
        proc.kill()
        raise
    return proc, url


@pytest.fixture
def front() -> Iterator[str]:
    proc, url = start_front()
    try:
        yield url
        pids = [worker["pid"] for worker in health(url)["workers"]]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "workers left running"


def health(url: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{url}/health", timeout=10).json()
    return answer


def turns_by_worker(url: str) -> dict[str, float]:
    """Chat turns each worker answered, from the front's merged metrics."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    counts = {str(w): 0.0 for w in range(WORKERS)}
    for line in text.splitlines():
        if line.startswith("rollway_turns_total{"):
            worker = line.split('worker="')[1].split('"')[0]
            counts[worker] += float(line.rsplit(" ", 1)[1])
    return counts


async def converse(gateway: RemoteGateway, rollout_id: str, turns: int) -> None:
    registration = await gateway.register(rollout_id, RegisterRequest(max_tokens=8))
    client = openai.AsyncOpenAI(base_url=gateway.base_url(rollout_id), api_key=registration.api_key)
    messages: list[Any] = [{"role": "user", "content": "look it up"}]
    async with client:
        for turn in range(turns):
            answer = await client.chat.completions.create(model="sim", messages=messages)
            messages += [answer.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": f"and then {turn}?"}]  # fmt: skip


@pytest.mark.timeout(180)
def test_each_rollouts_turns_reach_one_worker_and_make_one_exact_sample(front: str) -> None:
    async def scenario() -> None:
        gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
        ids = [on_worker(0, "zero-"), on_worker(1, "one-")]
        await asyncio.gather(*(converse(gateway, rollout_id, 3) for rollout_id in ids))
        assert {gateway.base_url(r).split("/v1/")[0] for r in ids}.isdisjoint({front})
        for rollout_id in ids:
            trajectory = await gateway.trajectory(rollout_id)
            assert len(trajectory.turns) == 3
            assert len(trajectory.samples) == 1  # every turn extends the one sequence
        await gateway.close()

    asyncio.run(scenario())
    assert turns_by_worker(front) == {"0": 3.0, "1": 3.0}


@pytest.mark.timeout(240)
def test_a_killed_worker_is_restarted_and_only_its_rollouts_fail_clearly(
    front: str, tmp_path: Path
) -> None:
    lost, kept = on_worker(1, "lost-"), on_worker(0, "kept-")

    async def before() -> None:
        gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
        update = await gateway.update_weights(NewWeights(str(tmp_path), mode="abort"))
        assert update.version == 1
        await asyncio.gather(converse(gateway, lost, 1), converse(gateway, kept, 1))
        await gateway.close()

    asyncio.run(before())
    victim = health(front)["workers"][1]["pid"]
    kill_worker_and_wait(front, 1)
    assert health(front)["workers"][1]["pid"] != victim

    async def after() -> None:
        gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
        with pytest.raises(InfrastructureError, match="lost: gateway worker 1"):
            await gateway.trajectory(lost)
        assert len((await gateway.trajectory(kept)).turns) == 1  # the other worker's go on
        fresh = on_worker(1, "fresh-")
        await converse(gateway, fresh, 1)  # the restarted worker takes new rollouts...
        versions = (await gateway.trajectory(fresh)).turns[0].policy_versions
        assert versions and set(versions) == {1}  # ...at the weights the others sample
        await gateway.close()

    asyncio.run(after())
    chat = {"model": "sim", "messages": [{"role": "user", "content": "still there?"}]}
    answer = httpx.post(f"{front}/v1/rollouts/{lost}/chat/completions", json=chat, timeout=30)
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "InfrastructureError"

    async def finally_unregister() -> None:
        gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
        with pytest.raises(UnknownRolloutError, match="lost"):  # the runner's "already gone"
            await gateway.unregister(lost)
        await gateway.close()

    asyncio.run(finally_unregister())


def kill_worker_and_wait(front: str, index: int) -> None:
    """SIGKILL worker ``index``, and return once the front has started it again."""
    victim = health(front)["workers"][index]
    os.kill(victim["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while not (worker := health(front)["workers"][index])["up"] or worker["restarts"] < 1:
        assert time.monotonic() < deadline, f"worker {index} was not started again: {worker}"
        time.sleep(0.1)


@pytest.mark.timeout(240)
def test_a_client_reruns_the_rollouts_a_dead_worker_took_as_infrastructure_failures(
    front: str, tmp_path: Path
) -> None:
    first_ids = [f"faults.t{i}.0.1" for i in range(ROLLOUTS)]
    on_one = {r for r in first_ids if worker_index(r, 2) == 1}
    assert 0 < len(on_one) < ROLLOUTS  # both workers hold some
    agent = FaultAgent(fault=lambda: kill_worker_and_wait(front, 1))
    gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
    tasks = [{"task_id": f"t{i}", "chats": 1} for i in range(ROLLOUTS)]
    client = RolloutClient(agent, gateway, store=str(tmp_path), exp_id="faults",
                           max_concurrent=ROLLOUTS, max_retry_attempts=1)  # fmt: skip
    with client:
        records = [item.result for item in client.run_batch(tasks)]
    for record in records:
        if record.rollout_id in on_one:
            assert (record.status, record.error_kind) == ("error", "infrastructure"), record
            assert "lost: gateway worker 1" in (record.reason or ""), record.reason
        else:
            assert record.status == "completed", (record.status, record.reason)
    retried = RolloutClient(FaultAgent(), RemoteGateway(front, admin_key=ADMIN_KEY),
                            store=str(tmp_path / "again"), exp_id="faults")  # fmt: skip
    with retried:
        again = [item.result for item in retried.run_batch(tasks)]
    assert all(record.status == "completed" for record in again)


@pytest.mark.timeout(240)
def test_the_lease_is_taken_right_after_its_worker_is_killed(front: str) -> None:
    """Taking the lease meets the worker that holds it killed, its death maybe not yet seen:
    it waits for the restart (as new rollouts do), never an InfrastructureError."""
    exp_id = on_worker(1, "leased")
    holder = LeaseHolder.this_process()

    async def take_after_kill() -> None:
        gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
        await gateway.take_lease(exp_id, holder, 30.0)
        os.kill(health(front)["workers"][1]["pid"], signal.SIGKILL)
        await gateway.take_lease(exp_id, holder, 30.0)  # the restarted worker holds it now
        other = LeaseHolder.this_process()
        with pytest.raises(ExperimentInUseError):  # held there indeed
            await gateway.take_lease(exp_id, other, 30.0)
        await gateway.close()

    asyncio.run(take_after_kill())
    assert health(front)["workers"][1]["restarts"] == 1


@pytest.mark.timeout(120)
def test_a_front_killed_with_sigkill_takes_its_workers_with_it() -> None:
    proc, url = start_front()
    try:
        pids = [worker["pid"] for worker in health(url)["workers"]]
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while alive := [pid for pid in pids if _running(pid)]:
            assert time.monotonic() < deadline, f"workers {alive} outlived their front"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        for pid in pids if "pids" in locals() else []:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a worker's parent is gone: init reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
