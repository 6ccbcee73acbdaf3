"""The Ray executor on a multi-node cluster started on this machine (``ray.cluster_utils.
Cluster``: a head with no CPUs and nodes of one CPU, each its own raylet and object store):
workers pinned one per node, a node lost mid-batch, the driver killed and restarted, and a
weight update shipped once per node to every worker.

The cluster is this module's (another module initialises Ray its own way, and a process joins
one cluster at a time). Each worker builds its own gateway over ``sim`` (a few seconds of CPU
for its tokenizer), so each test starts only the workers its claim needs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import ray
from ray.cluster_utils import Cluster

from rollway.client import RolloutClient
from rollway.errors import ConfigError
from rollway.executors import RayExecutor
from rollway.store import store_from_uri
from tests.agents.server.fixtures import wait_until
from tests.executors.agents import ProbeAgent, events
from tests.executors.probes import least_done, weights_memory
from tests.outcomes import ENDED

ROOT = Path(__file__).resolve().parents[2]
ENGINE = "sim://?output_len=4"
#: Each node's object store: the smallest Ray takes; rollouts send only small records.
STORE_BYTES = 80 * 2**20
#: A lost node is declared dead within about a second, not Ray's default 15 s or more.
FAST_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


@pytest.fixture(scope="module")
def nodes() -> Iterator[Cluster]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,  # the driver's node: workers go to the others
            "object_store_memory": STORE_BYTES,
            "include_dashboard": False,
            "_system_config": FAST_DEATH,
        },
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_per_node_needs_a_node_with_room_and_no_worker_count(nodes: Cluster) -> None:
    with pytest.raises(ConfigError, match="no live Ray node has room"):
        RayExecutor(workers_per_node=1, resources_per_worker={"CPU": 1, "GPU": 1})._placement(ray)
    with pytest.raises(ConfigError, match="goes without num_workers"):
        RayExecutor(num_workers=2, workers_per_node=1)
    # The head (no CPUs) holds no worker; each node with a CPU holds one, or two.
    workers = {n.node_id for n in nodes.worker_nodes}
    assert Counter(RayExecutor(workers_per_node=2)._placement(ray)) == dict.fromkeys(workers, 2)


def test_a_node_lost_mid_batch_reruns_its_rollouts_once_as_infrastructure(
    nodes: Cluster, tmp_path: Path
) -> None:
    victim = nodes.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
    nodes.wait_for_nodes()
    log, hold = tmp_path / "events", tmp_path / "hold"
    hold.touch()
    tasks = [{"task_id": f"n{i}", "hold": str(hold), "log": str(log)} for i in range(18)]
    executor = RayExecutor(workers_per_node=1)
    with RolloutClient(
        ProbeAgent, ENGINE, store=str(tmp_path), exp_id="lost", executor=executor,
        max_concurrent=len(tasks),
    ) as client:  # fmt: skip
        placed = {info["node"]: info["pid"] for info in executor.worker_info}
        assert set(placed) == {n.node_id for n in nodes.worker_nodes}  # one worker per node
        items: list = []
        batch = ray_thread(lambda: items.extend(client.run_batch(tasks)))
        wait_until(lambda: len(events(log)) == len(tasks), timeout=60)  # all in flight
        on_victim = {rid for _, _, pid, rid in events(log) if pid == placed[victim.node_id]}
        assert 0 < len(on_victim) < len(tasks)
        nodes.remove_node(victim)  # its raylet, object store and worker
        wait_until(lambda: not alive(placed[victim.node_id]), timeout=30)
        hold.unlink()
        batch.join(timeout=120)
        assert not batch.is_alive()
    lost_keys = {rid.split(".", 1)[1].rsplit(".", 1)[0] for rid in on_victim}  # exp.KEY.attempt
    assert len(items) == len(tasks) and all(i.result.status in ENDED for i in items)
    records = list(store_from_uri(str(tmp_path), "lost").records())
    assert sorted(r.rollout_key for r in records) == sorted(i.result.rollout_key for i in items)
    assert len({r.rollout_key for r in records}) == len(tasks)
    assert len({r.rollout_id for r in records}) == len(tasks)  # no id twice
    for record in records:
        lost = record.rollout_key in lost_keys
        assert record.status in ENDED and record.error_kind is None
        assert record.attempts == (2 if lost else 1), record.rollout_key
        assert record.rollout_id.endswith(".2" if lost else ".1")
    assert executor.redispatched == len(on_victim)
    # Each record written once: the lost node's rollouts never reached the store.
    assert len((tmp_path / "lost" / "index.jsonl").read_text().splitlines()) == len(tasks)
    gone = [w for w in executor.load() if w["node"] == victim.node_id]
    assert [w["up"] for w in gone] == [False]


DRIVER = """
import json, sys
import ray
from rollway.client import RolloutClient
from rollway.executors import RayExecutor
from tests.executors.agents import ProbeAgent

address, store, engine, tasks = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
ray.init(address=address, log_to_driver=False, logging_level="ERROR")
executor = RayExecutor(workers_per_node=1)
with RolloutClient(ProbeAgent, engine, store=store, exp_id="restart", executor=executor,
                   max_concurrent=len(tasks)) as client:
    print(json.dumps([info["pid"] for info in executor.worker_info]), flush=True)
    for item in client.run_batch(tasks):
        pass
"""


def test_a_driver_killed_mid_batch_resumes_from_the_store_without_running_anything_twice(
    nodes: Cluster, tmp_path: Path
) -> None:
    log, hold = tmp_path / "events", tmp_path / "hold"
    hold.touch()
    quick = [{"task_id": f"q{i}", "log": str(log)} for i in range(6)]
    held = [{"task_id": f"h{i}", "hold": str(hold), "log": str(log)} for i in range(8)]
    tasks = quick + held
    index = tmp_path / "restart" / "index.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, nodes.address, str(tmp_path), ENGINE,
         orjson.dumps(tasks).decode()],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        old_workers = orjson.loads(driver.stdout.readline())
        stored = lambda: len(index.read_text().splitlines()) if index.exists() else 0  # noqa: E731
        wait_until(lambda: stored() == len(quick) and len(events(log)) >= len(tasks), 60)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait(timeout=30)
        driver.stdout.close()
    # Ray ends a dead driver's workers, and with them its rollouts in flight.
    wait_until(lambda: not any(alive(pid) for pid in old_workers), timeout=60)
    hold.unlink()

    with RolloutClient(
        ProbeAgent, ENGINE, store=str(tmp_path), exp_id="restart",
        executor=RayExecutor(workers_per_node=1), max_concurrent=len(tasks),
    ) as client:  # fmt: skip
        items = list(client.run_batch(tasks))
    assert len(items) == len(tasks) and all(i.result.status in ENDED for i in items)
    resumed = {i.result.rollout_key for i in items if i.from_store}
    assert resumed == {i.result.rollout_key for i in items if tasks[i.index] in quick}
    records = list(store_from_uri(str(tmp_path), "restart").records())
    assert len({r.rollout_key for r in records}) == len(records) == len(tasks)
    assert len({r.rollout_id for r in records}) == len(tasks)
    # The quick ones written once, by the first driver; the held ones once, after the restart.
    assert len(index.read_text().splitlines()) == len(tasks)


def test_a_weight_update_reaches_every_worker_once_through_one_copy_per_node(
    nodes: Cluster, tmp_path: Path
) -> None:
    """Three nodes of two workers, each with its own ``sim`` engine, twelve rollouts in
    flight (two per worker), halfway through their turn, when a 16 MB state dict of numpy
    arrays comes in ``keep`` mode. One copy per node: Ray's object directory lists the update
    on each node once, and both workers of a node read its arrays in place from the same bytes
    of their node's object store (the same shared-memory file and offset: neither pickled
    into each worker's call, which would put one object per call, nor copied per worker).
    Every token says the weights that sampled it: the turns frozen mid-way carry both."""
    third = nodes.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
    nodes.wait_for_nodes()
    try:
        check_update_across_nodes(nodes, tmp_path)
    finally:
        nodes.remove_node(third)


def check_update_across_nodes(nodes: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "events"
    tasks = [{"task_id": f"w{i}", "log": str(log)} for i in range(12)]
    weights = {f"layer{i}": np.full((1024, 1024), i, np.float32) for i in range(4)}
    executor = RayExecutor(workers_per_node=2, resources_per_worker={"CPU": 0.5})
    with RolloutClient(
        ProbeAgent, "sim://?output_len=4&latency_s=5", store=str(tmp_path), exp_id="weights",
        executor=executor, max_concurrent=len(tasks),
    ) as client:  # fmt: skip
        node_of = {info["pid"]: info["node"] for info in executor.worker_info}
        workers = [(w.actor, w.node) for w in executor._workers]
        assert len(workers) == 6 and len(set(node_of.values())) == 3
        items: list = []
        batch = ray_thread(lambda: items.extend(client.run_batch(tasks)))

        def halfway() -> bool:  # each worker's two turns past half their wait
            probes = ray.get([actor.__ray_call__.remote(least_done) for actor, _ in workers])
            return all(count == 2 and share >= 0.5 for count, share in probes)

        wait_until(halfway, timeout=60)
        update = client.update_weights(weights, mode="keep")
        assert update["policy_version"] == 1 == client.policy_version
        taken = ray.get([actor.__ray_call__.remote(weights_memory) for actor, _ in workers])
        batch.join(timeout=60)
        assert not batch.is_alive()

    # Each worker's engine took the update once, as version 1, read in place (not writable).
    assert all([(u["version"], u["writable"]) for u in t] == [(1, False)] for t in taken)
    copies: dict[str, set[tuple[str, int, int]]] = {}
    for (_, node), (memory,) in zip(workers, taken, strict=True):
        copies.setdefault(node, set()).add((memory["device"], memory["inode"], memory["offset"]))
    assert all(len(places) == 1 for places in copies.values()), copies  # one per node
    assert len({inode for places in copies.values() for _, inode, _ in places}) == 3
    (located,) = ray.experimental.get_object_locations([executor._last_update[0]]).values()
    head = nodes.head_node.node_id
    assert sorted(located["node_ids"]) == sorted({head, *copies})  # the driver's, one a node
    assert located["object_size"] >= 16 * 2**20

    records = list(store_from_uri(str(tmp_path), "weights").records())
    assert len(records) == len(tasks) and {r.status for r in records} == {"completed"}
    ran_on = {rid: node_of[pid] for event, _, pid, rid in events(log) if event == "start"}
    assert Counter(ran_on[r.rollout_id] for r in records) == dict.fromkeys(copies, 4)
    for record in records:
        (turn,) = record.trajectory.turns
        old = turn.policy_versions.count(0)  # frozen past half its wait: 2 or 3 tokens of 4
        assert turn.policy_versions == [0] * old + [1] * (4 - old) and 2 <= old <= 3
        assert turn.reissued == 0 and record.attempts == 1 and record.policy_version == 0


def ray_thread(target):  # type: ignore[no-untyped-def]
    import threading

    thread = threading.Thread(target=target)
    thread.start()
    return thread
