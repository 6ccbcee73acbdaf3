"""Rollouts on Ray: throughput for 1, 2 and 4 worker actors, and the driver's memory.

Each worker runs its own in-process gateway over the simulated engine (a load generator:
``sim://`` with a fixed latency per turn), so the figures are rollway's own cost: the agent
loop, the gateway (template, tokenization, recording), the store write and the Ray hop.
The local executor runs the same batch as the baseline.

Memory: a fresh driver process runs 10,000 rollouts and reports how much its resident memory
grew, with the Ray executor (light records; trajectories stay in the store) and with the local
executor (whole records in memory) for comparison.

Usage: python benchmarks/ray_scaling.py [--rollouts N] [--memory-rollouts N] [--cpus N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.executors import RayExecutor
from rollway.results import AgentResult

TURNS = 3
ENGINE = "sim://?latency_s=0.05&output_len=16"


class ThreeTurnAgent(AgentLoop):
    """Three model calls per rollout, each seeing the whole conversation so far."""

    name = "three-turn"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.task["q"]}]
        for turn in range(TURNS):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": f"And step {turn + 2}?"}]
        return ctx.complete(messages[:-1], reward=1.0)


def tasks(count: int) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", "q": f"Question {i}: what is {i} + {i}?"} for i in range(count)]


def throughput(executor: Any, rollouts: int, concurrency: int) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory() as store,
        RolloutClient(
            ThreeTurnAgent, ENGINE, store=store, executor=executor, max_concurrent=concurrency
        ) as client,
    ):
        started, cpu = time.perf_counter(), time.process_time()
        done = sum(1 for item in client.run_batch(tasks(rollouts)) if item.success)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    # The driver's CPU per rollout (all its threads): what caps one driver's dispatch rate.
    return {"rollouts_per_s": done / wall, "driver_cpu_ms": cpu * 1000 / max(done, 1)}


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_child(kind: str, rollouts: int, cpus: int) -> None:
    """In a fresh process: resident memory growth of a driver over ``rollouts``."""
    executor: Any = "local"
    if kind == "ray":
        import ray

        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        executor = RayExecutor(num_workers=2, resources_per_worker={"CPU": 1})
    with (
        tempfile.TemporaryDirectory() as store,
        RolloutClient(
            ThreeTurnAgent, ENGINE, store=store, executor=executor, max_concurrent=256
        ) as client,
    ):
        before = rss_mb()
        tenth, items = before, []
        for item in client.run_batch(tasks(rollouts)):
            items.append(item)  # the caller keeps every item
            if len(items) == rollouts // 10:
                tenth = rss_mb()
        after = rss_mb()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ok = sum(1 for item in items if item.success)
    # Per rollout past the first tenth: what each more rollout costs, without start-up growth.
    marginal_kb = (after - tenth) * 1024 / (rollouts - rollouts // 10)
    print(json.dumps({"ok": ok, "growth_mb": after - before, "marginal_kb": marginal_kb,
                      "peak_mb": peak}))  # fmt: skip


def measure_memory(kind: str, rollouts: int, cpus: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", kind,
         "--memory-rollouts", str(rollouts), "--cpus", str(cpus)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--memory-rollouts", type=int, default=10_000)
    parser.add_argument("--cpus", type=int, default=4, help="Logical CPUs for the Ray cluster.")
    parser.add_argument("--memory-only", action="store_true", help="Skip the throughput runs.")
    parser.add_argument("--memory-child", choices=["ray", "local"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.memory_rollouts, args.cpus)
        return
    if not args.memory_only:
        scaling(args.rollouts, args.concurrency, args.cpus)
    print(f"driver memory for {args.memory_rollouts} rollouts (resident growth, fresh process):")
    for kind in ("ray", "local"):
        mem = measure_memory(kind, args.memory_rollouts, args.cpus)
        print(
            f"  {kind:5s} executor  {mem['growth_mb']:7.1f} MB  ({mem['marginal_kb']:.1f} KB "
            f"per further rollout, {mem['ok']} ok, peak RSS {mem['peak_mb']:.0f} MB)"
        )


def scaling(rollouts: int, concurrency: int, cpus: int) -> None:
    """Rollouts/s: the local executor, then Ray with 1, 2 and 4 workers."""
    import ray

    print(f"{os.cpu_count()} cores; {rollouts} rollouts of {TURNS} turns, {ENGINE}")
    local = throughput("local", rollouts, concurrency)
    print(
        f"local executor       {local['rollouts_per_s']:8.1f} rollouts/s"
        f"{'':35s}driver CPU {local['driver_cpu_ms']:.2f} ms/rollout"
    )
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    base = None
    for workers in (1, 2, 4):
        executor = RayExecutor(num_workers=workers, resources_per_worker={"CPU": 1})
        result = throughput(executor, rollouts, concurrency)
        base = base or result["rollouts_per_s"]
        print(
            f"ray, {workers} worker{'s' if workers > 1 else ' '}     "
            f"{result['rollouts_per_s']:8.1f} rollouts/s   x{result['rollouts_per_s'] / base:.2f}"
            f" vs 1 worker, x{result['rollouts_per_s'] / local['rollouts_per_s']:.2f} vs local"
            f"   driver CPU {result['driver_cpu_ms']:.2f} ms/rollout"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
