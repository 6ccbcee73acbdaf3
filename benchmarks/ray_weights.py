"""A weight update across the nodes of a Ray cluster on this machine: seconds and megabytes
shipped against the number of nodes, with one and two workers per node.

``ray.cluster_utils.Cluster`` starts a head (no CPUs: the driver's node) and ``--nodes`` nodes
of one CPU, each its own raylet and object store; ``RayExecutor(workers_per_node=K)`` pins K
workers to each, each with its own gateway over the simulated engine (an update only moves
its version: what is timed is the transport, not a model's copy). The state dict is
``--mb`` megabytes of float32 numpy arrays (4 MB each). The executor puts it once in the
driver's object store; each node pulls it once and its workers read it in place. Ray's object
directory says where the update lies afterwards: the head and every node, once each.

Each node count runs in a fresh process (its own cluster). Per update: the seconds
``client.update_weights`` took (put, pull to each node, every worker's engine, pause and
resume), the nodes holding a copy, and the megabytes shipped to them. For scale, the
seconds one ``ray.put`` of the same arrays takes on the head.

Usage: python benchmarks/ray_weights.py [--mb 100] [--nodes 1 2 4 8] [--per-node 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# The benchmarks are not an installed package: import them from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ray_nodes import start_cluster

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.executors import RayExecutor
from rollway.results import AgentResult

ARRAY_MB = 4
UPDATES = 2


class IdleAgent(AgentLoop):
    """No rollout runs here: the client needs an agent to start its workers."""

    name = "idle"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        return ctx.complete([], reward=0.0)


def state_dict(mb: int) -> dict[str, np.ndarray]:
    """``mb`` megabytes of float32 arrays, 4 MB each (a layer's weights)."""
    side = int((ARRAY_MB * 2**20 / 4) ** 0.5)
    return {f"layer{i}.weight": np.full((side, side), i, np.float32) for i in range(mb // ARRAY_MB)}


def measure(mb: int, nodes: int, per_node: list[int]) -> list[dict[str, Any]]:
    """Updates of ``mb`` MB on a fresh cluster of ``nodes``, for each workers-per-node count."""
    import ray

    weights = state_dict(mb)
    size = sum(a.nbytes for a in weights.values())
    # Every update a sim engine takes stays referenced (its ``updates``): room for all of them.
    cluster = start_cluster(nodes, (UPDATES + 1) * size + 80 * 2**20)
    rows = []
    try:
        began = time.perf_counter()
        ref = ray.put(weights)
        put_s = time.perf_counter() - began
        del ref  # freed: the updates have the stores to themselves
        for workers in per_node:
            rows.append(update_on(weights, nodes, workers, put_s, cluster.head_node.node_id))
    finally:
        ray.shutdown()
        cluster.shutdown()
    return rows


def update_on(
    weights: dict[str, np.ndarray], nodes: int, per_node: int, put_s: float, head: str
) -> dict[str, Any]:
    import ray

    executor = RayExecutor(workers_per_node=per_node, resources_per_worker={"CPU": 1 / per_node})
    seconds, shipped = [], []
    with (
        tempfile.TemporaryDirectory() as store,
        RolloutClient(IdleAgent, "sim://", store=store,
                      executor=executor, show_progress=False) as client,
    ):  # fmt: skip
        for _ in range(UPDATES):
            began = time.perf_counter()
            client.update_weights(weights, mode="drain")
            seconds.append(time.perf_counter() - began)
            assert executor._last_update is not None
            (where,) = ray.experimental.get_object_locations([executor._last_update[0]]).values()
            copies = [node for node in where["node_ids"] if node != head]
            shipped.append(len(copies) * where["object_size"] / 2**20)
    workers = len(executor.worker_info)
    return {"nodes": nodes, "per_node": per_node, "workers": workers, "seconds": seconds,
            "node_copies": len(copies), "mb_shipped": shipped[-1], "put_s": put_s}  # fmt: skip


def child(mb: int, nodes: int, per_node: list[int]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--mb", str(mb), "--nodes", str(nodes),
         "--per-node", *map(str, per_node)],
        capture_output=True, text=True,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{nodes} nodes failed:\n{out.stderr[-3000:]}")
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--per-node", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        (nodes,) = args.nodes
        print(json.dumps(measure(args.mb, nodes, args.per_node)))
        return
    print(f"{os.cpu_count()} cores; a {args.mb} MB state dict of float32 numpy arrays")
    for nodes in args.nodes:
        for row in child(args.mb, nodes, args.per_node):
            first, second = row["seconds"]
            print(
                f"{nodes} nodes x {row['per_node']} workers ({row['workers']}): update "
                f"{first:.2f} s, then {second:.2f} s; {row['node_copies']} node copies, "
                f"{row['mb_shipped']:.0f} MB shipped (one ray.put on the head: "
                f"{row['put_s']:.2f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
