"""Rollouts in flight on a multi-node Ray cluster on this machine: 1,000 -> 10,000 -> 100,000.

``ray.cluster_utils.Cluster`` starts a head (no CPUs: the driver's node) and ``--nodes`` nodes
of one CPU, each its own raylet and object store; ``RayExecutor(workers_per_node=1)`` pins one
worker to each, with its own gateway over the simulated engine. Each rollout is one short turn
whose answer takes ``--latency-s`` (long enough that the whole batch is in flight at once), so
the figures are what holding a rollout in flight costs, not what running it does.

Each size runs in a fresh process (its own cluster) and reports: the time to dispatch the
batch (until every rollout is on a worker), the driver's resident memory per rollout in flight
and per finished rollout (the caller counts items and keeps none; freed memory handed back to
the system first), each worker's per rollout in
flight, rollouts/s once they finish, and responsiveness while they are in flight: the longest
the first status line (due ``--status-s`` after the batch starts) and the longest gap between
the next ones until the last item, and the client's event loop's longest lag (in all, and
while the batch is dispatched).

Usage: python benchmarks/ray_nodes.py [--rollouts 1000 10000] [--nodes 4] [--latency-s S] [--again]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.executors import RayExecutor
from rollway.results import AgentResult

STORE_BYTES = 80 * 2**20  # each node's object store: the smallest Ray takes
SAMPLE_S = 0.25


class OneTurnAgent(AgentLoop):
    """One model call on a short prompt: a rollout held in flight by the engine's latency."""

    name = "one-turn"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.task["q"]}]
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message], reward=1.0)


@dataclass
class Figures:
    rollouts: int
    nodes: int
    latency_s: float
    dispatch_s: float = 0.0
    peak_in_flight: int = 0
    driver_kb_in_flight: float = 0.0
    driver_kb_finished: float = 0.0
    worker_kb_in_flight: list[float] = field(default_factory=list)
    rollouts_per_s: float = 0.0
    wall_s: float = 0.0
    first_status_s: float = 0.0
    status_gap_s: float = 0.0
    loop_lag_s: float = 0.0
    loop_lag_dispatching_s: float = 0.0
    #: The longest collection of Python's cyclic garbage collector (it stops every thread).
    gc_pause_s: float = 0.0
    ok: int = 0
    #: ``--again``: what a second batch of the same size left on top of the first, per
    #: rollout: what finished rollouts keep, without the first batch's high-water mark.
    driver_kb_finished_again: float | None = None


def rss_kb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


def retained_kb() -> float:
    """Resident memory once freed memory goes back to the system: what finished rollouts
    still hold, not the high-water mark of those in flight (glibc keeps freed pages)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_kb()


def tasks(count: int) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", "q": f"What is {i} + 1?"} for i in range(count)]


def start_cluster(nodes: int, store_bytes: int = STORE_BYTES) -> Any:
    """A head with no CPUs and ``nodes`` nodes of one CPU each, this process its driver."""
    import ray
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 0, "object_store_memory": store_bytes, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(nodes):
        cluster.add_node(num_cpus=1, object_store_memory=store_bytes)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    return cluster


class GcPauses:
    """The longest pause of the cyclic garbage collector (``gc.callbacks``) while ``on``: the
    batch's own, not the benchmark's ``gc.collect()`` before and after it."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.on = False
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.monotonic()
        elif self.on:
            self.longest = max(self.longest, time.monotonic() - self._began)


class StatusTimes(logging.Handler):
    """When each status line came (the client logs them when it draws no progress bar)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("batch status"):
            self.times.append(time.monotonic())


def measure(
    rollouts: int, nodes: int, latency_s: float, status_s: float, again: bool = False
) -> Figures:
    """One batch of ``rollouts`` on a fresh cluster of ``nodes`` (in this process)."""
    import ray

    figures = Figures(rollouts, nodes, latency_s)
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    cluster = start_cluster(nodes)
    status = StatusTimes()
    logging.getLogger("rollway.client").addHandler(status)
    logging.getLogger("rollway.client").setLevel(logging.INFO)
    executor = RayExecutor(workers_per_node=1)
    engine = f"sim://?latency_s={latency_s}&output_len=8"
    try:
        with (
            tempfile.TemporaryDirectory() as store,
            RolloutClient(
                OneTurnAgent, engine, store=store, executor=executor, max_concurrent=rollouts,
                show_progress=False, status_interval=status_s,
            ) as client,
        ):  # fmt: skip
            run_batch(client, executor, rollouts, figures, status, pauses)
            if again:
                figures.driver_kb_finished_again = batch_again(client, rollouts)
    finally:
        logging.getLogger("rollway.client").removeHandler(status)
        gc.callbacks.remove(pauses)
        figures.gc_pause_s = pauses.longest
        ray.shutdown()
        cluster.shutdown()
    return figures


def run_batch(
    client: RolloutClient,
    executor: RayExecutor,
    rollouts: int,
    figures: Figures,
    status: Any,
    pauses: GcPauses,
) -> None:
    workers = [info["pid"] for info in executor.worker_info]
    driver_idle, workers_idle = retained_kb(), [rss_kb(pid) for pid in workers]
    batch = tasks(rollouts)
    started = time.monotonic()
    sampler = Sampler(client, executor, workers, rollouts, started)
    sampler.start()
    finished_at: list[float] = []
    pauses.on = True
    for item in client.run_batch(batch):
        figures.ok += item.success
        if not finished_at:
            sampler.first_finished()
        finished_at.append(time.monotonic())
    pauses.on = False
    end = time.monotonic()
    sampler.stop()
    figures.wall_s = end - started
    figures.dispatch_s = (sampler.dispatched_at or end) - started
    figures.peak_in_flight = sampler.peak_in_flight
    figures.driver_kb_in_flight = (sampler.driver_peak - driver_idle) / rollouts
    figures.driver_kb_finished = (retained_kb() - driver_idle) / rollouts
    share = rollouts / len(workers)
    figures.worker_kb_in_flight = [
        round((peak - idle) / share, 2)
        for peak, idle in zip(sampler.workers_peak, workers_idle, strict=True)
    ]
    spread = finished_at[-1] - finished_at[0] if len(finished_at) > 1 else 0.0
    figures.rollouts_per_s = len(finished_at) / spread if spread else 0.0
    lines = status.times
    figures.first_status_s = (lines[0] if lines else end) - started
    # Until the last item: the batch's summary is written after it, with no line due.
    last = finished_at[-1] if finished_at else end
    gaps = [b - a for a, b in zip(lines, [*lines[1:], last], strict=True) if a < last]
    figures.status_gap_s = max(gaps, default=0.0)
    figures.loop_lag_s = sampler.loop_lag
    figures.loop_lag_dispatching_s = sampler.loop_lag_dispatching


def batch_again(client: RolloutClient, rollouts: int) -> float:
    """A second batch as large (run again, not resumed): the driver's retained growth over
    the first's, per rollout. The first batch's figure holds the pages of its in-flight peak,
    which Python keeps while a few live objects sit among them; the same peak again reuses
    them, so what a second batch adds is what each finished rollout leaves."""
    before = retained_kb()
    for _ in client.run_batch(tasks(rollouts), resume=False):
        pass
    return (retained_kb() - before) / rollouts


class Sampler(threading.Thread):
    """Every ``SAMPLE_S``: the driver's and workers' memory until the first rollout finishes,
    rollouts on workers (when all are, the batch is dispatched), and the client's event loop's
    lag (a no-op's round trip)."""

    def __init__(
        self, client: Any, executor: RayExecutor, workers: list[int], total: int, t0: float
    ) -> None:
        super().__init__(daemon=True)
        self.client, self.executor, self.workers, self.total = client, executor, workers, total
        self.dispatched_at: float | None = None
        self.peak_in_flight = 0
        self.driver_peak = rss_kb()
        self.workers_peak = [rss_kb(pid) for pid in workers]
        self.loop_lag = 0.0
        self.loop_lag_dispatching = 0.0
        self._holding = True  # no rollout finished yet: memory is what in flight costs
        self._done = threading.Event()

    def first_finished(self) -> None:
        self._holding = False

    def stop(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            in_flight = sum(w["in_flight"] for w in self.executor.load())
            self.peak_in_flight = max(self.peak_in_flight, in_flight)
            if self.dispatched_at is None and in_flight >= self.total:
                self.dispatched_at = time.monotonic()
            if self._holding:
                self.driver_peak = max(self.driver_peak, rss_kb())
                self.workers_peak = [
                    max(peak, rss_kb(pid))
                    for peak, pid in zip(self.workers_peak, self.workers, strict=True)
                ]
            asked = time.monotonic()
            self.client._loop.submit(_noop()).result(timeout=300)
            lag = time.monotonic() - asked
            self.loop_lag = max(self.loop_lag, lag)
            if self.dispatched_at is None:
                self.loop_lag_dispatching = max(self.loop_lag_dispatching, lag)


async def _noop() -> None:
    return None


def child(
    rollouts: int, nodes: int, latency_s: float, status_s: float, again: bool
) -> dict[str, Any]:
    """``measure`` in a fresh process: its memory figures start from nothing else's."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--rollouts", str(rollouts), "--nodes",
         str(nodes), "--latency-s", str(latency_s), "--status-s", str(status_s),
         *(["--again"] if again else [])],
        capture_output=True, text=True,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{rollouts} rollouts failed:\n{out.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def default_latency(rollouts: int) -> float:
    """Long enough to dispatch the batch before the first answer (~3 ms a rollout here)."""
    return round(15 + rollouts * 0.004, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--latency-s", type=float, help="Default: 15 s + 4 ms a rollout.")
    parser.add_argument("--status-s", type=float, default=5.0)
    parser.add_argument(
        "--again", action="store_true", help="Run each size twice: what finished rollouts keep."
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        (count,) = args.rollouts
        figures = measure(count, args.nodes, args.latency_s, args.status_s, args.again)
        print(json.dumps(asdict(figures)))
        return
    print(f"{os.cpu_count()} cores; {args.nodes} nodes of 1 CPU, one worker each")
    for count in args.rollouts:
        latency = args.latency_s or default_latency(count)
        f = child(count, args.nodes, latency, args.status_s, args.again)
        again = f["driver_kb_finished_again"]
        print(
            f"{count:>7} rollouts (latency {latency:.0f} s): {f['ok']} ok, dispatched in "
            f"{f['dispatch_s']:.1f} s (peak {f['peak_in_flight']} in flight); driver "
            f"{f['driver_kb_in_flight']:.1f} KB/rollout in flight, {f['driver_kb_finished']:.2f}"
            f" KB/finished; workers {f['worker_kb_in_flight']} KB/rollout in flight; "
            f"{f['rollouts_per_s']:.0f} rollouts/s finishing, {f['wall_s']:.0f} s in all; "
            f"first status line {f['first_status_s']:.1f} s, then at most {f['status_gap_s']:.1f}"
            f" s apart; loop lag {f['loop_lag_s']:.2f} s ({f['loop_lag_dispatching_s']:.2f} s "
            f"while dispatching); longest GC pause {f['gc_pause_s']:.2f} s"
            + (f"; a second batch left {again:.2f} KB/rollout" if again is not None else ""),
            flush=True,
        )


if __name__ == "__main__":
    main()
