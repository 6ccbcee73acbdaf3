"""Routing across simulated SGLang servers: 4 `rollway sim-server` processes, 1000 concurrent
rollouts of 5 turns through one in-process gateway with the routed engine.

Reports throughput, load imbalance (max/mean in-flight, sampled), the sticky hit rate, the
gateway's CPU time per turn and the rollouts that failed. ``--dead N`` lists N more hosts with
nothing listening first in the fleet (failover). Usage:
python benchmarks/routing.py [--rollouts N] [--servers N] [--dead N]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from transformers import AutoTokenizer

from rollway.engines import engine_from_spec
from rollway.engines.remote.router import RoutedEngine
from rollway.errors import EngineError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.model_folders import resolve_model_path

TURNS = 5


def start_servers(count: int, latency_s: float) -> tuple[list[subprocess.Popen], list[str]]:
    procs, hosts = [], []
    for _ in range(count):
        port = _free_port()
        cmd = [sys.executable, "-m", "rollway", "sim-server", "--port", str(port),
               "--latency-s", str(latency_s), "--output-len", "16"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
        hosts.append(f"127.0.0.1:{port}")
    for host in hosts:
        _wait_for(host)
    return procs, hosts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(host: str) -> None:
    address, port = host.split(":")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, int(port)), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{host} did not start")


async def run(gateway: Gateway, router: RoutedEngine, rollouts: int) -> dict[str, Any]:
    samples: list[float] = []
    failed: list[str] = []

    async def sample_load() -> None:
        while True:
            loads = [e.in_flight for e in router.endpoints if e.healthy]
            if sum(loads):
                samples.append(max(loads) / statistics.fmean(loads))
            await asyncio.sleep(0.05)

    async def rollout(index: int) -> None:
        rollout_id = f"r{index}"
        gateway.register(rollout_id, {"max_tokens": 16})
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {index}"}]
        for turn in range(TURNS):
            try:
                reply = await gateway.chat(rollout_id, {"messages": messages})
            except EngineError:
                failed.append(rollout_id)
                return
            messages += [reply.message, {"role": "tool", "content": f"result {turn}"}]

    sampler = asyncio.create_task(sample_load())
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*[rollout(i) for i in range(rollouts)])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    sampler.cancel()
    turns = rollouts * TURNS
    return {
        "turns/s": turns / wall,
        "imbalance max/mean in-flight (median sample)": statistics.median(samples or [1.0]),
        "sticky hit rate": router.sticky_hits / max(1, turns - rollouts),
        "gateway CPU per turn (ms)": cpu / turns * 1000,
        "failed rollouts": len(failed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--dead", type=int, default=0, help="hosts with nothing listening")
    parser.add_argument("--latency-s", type=float, default=0.05)
    args = parser.parse_args()
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path()))
    procs, hosts = start_servers(args.servers, args.latency_s)
    try:
        dead = [f"127.0.0.1:{_free_port()}" for _ in range(args.dead)]
        router = engine_from_spec("sglang://" + ",".join(dead + hosts))
        assert isinstance(router, RoutedEngine)
        gateway = Gateway(router, renderer, model_name="sim")
        print(f"{args.servers} simulated SGLang servers ({args.latency_s * 1000:.0f} ms/turn), "
              f"{args.dead} dead, {args.rollouts} concurrent rollouts x {TURNS} turns")  # fmt: skip
        figures = asyncio.run(_run_and_close(gateway, router, args.rollouts))
        for name, value in figures.items():
            print(f"  {name:<45} {value:10.3f}")
        served = {e.name: e.served for e in router.endpoints}
        refused = {e.name: e.refused for e in router.endpoints if e.refused}
        print(f"  turns per server: {served}; refused connects: {refused}")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()


async def _run_and_close(gateway: Gateway, router: RoutedEngine, rollouts: int) -> dict[str, Any]:
    try:
        return await run(gateway, router, rollouts)
    finally:
        await router.close()


if __name__ == "__main__":
    main()
