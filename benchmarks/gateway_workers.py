"""`rollway gateway --workers N` against one process: turns/s of multi-turn tool conversations
at 64 and 256 concurrent rollouts over the simulated engine, the gateway served as in
production (`rollway gateway` subprocesses on loopback, an aiohttp client in this process
calling each rollout's base URL as its registration answered it).

The client, the front, the workers and their simulated engines all share this machine's
cores: on a machine with fewer cores than workers + 2 the figures say what the front costs
more than what the workers add.

Usage: python benchmarks/gateway_workers.py [--quick] [--workers 2] [--latency-s 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
import psutil
from benchmarks.gateway_overhead import TOOL, TURNS, Run, TurnFn, drive

CONCURRENCY = (64, 256)


@dataclass(frozen=True)
class Row:
    workers: int
    concurrency: int
    run: Run
    #: CPU seconds of the process on the port (the front, or the one gateway) and of its
    #: workers, over the run: what a turn costs whatever else the machine is doing. With
    #: workers the front sees only registrations (the turns go to the workers' ports).
    front_cpu_s: float
    workers_cpu_s: float

    def cpu_ms_per_turn(self, seconds: float) -> float:
        return seconds * 1000.0 / len(self.run.latencies_s)


def registered_turns(session: aiohttp.ClientSession, url: str, admin_key: str) -> TurnFn:
    """An agent as the docs write one: each rollout's turns go to the base URL its
    registration answered (with workers: the worker's own port, past the front)."""
    rollouts: dict[str, tuple[str, dict[str, str]]] = {}
    admin = {"Authorization": f"Bearer {admin_key}"}

    async def turn(rollout_id: str, messages: list[dict]) -> dict:
        if rollout_id not in rollouts:
            register = f"{url}/v1/rollouts/{rollout_id}/register"
            async with session.post(register, json={"max_tokens": 64}, headers=admin) as r:
                answer = await r.json()
                assert r.status == 200, answer
            headers = {"Authorization": f"Bearer {answer['api_key']}"}
            rollouts[rollout_id] = (f"{answer['base_url']}/chat/completions", headers)
        chat, headers = rollouts[rollout_id]
        body = {"messages": messages, "tools": [TOOL]}
        async with session.post(chat, json=body, headers=headers) as r:
            r.raise_for_status()
            return (await r.json())["choices"][0]["message"]

    return turn


def cpu_s(process: psutil.Process) -> tuple[float, float]:
    """User + system CPU seconds of ``process`` and of its children together."""
    own = process.cpu_times()
    children = 0.0
    for child in process.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            times = child.cpu_times()
            children += times.user + times.system
    return own.user + own.system, children


def start_gateway(engine_spec: str, admin_key: str, workers: int) -> tuple[subprocess.Popen, str]:
    """`rollway gateway --workers N`; returns once it accepts connections (the front does only
    once every worker answers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", engine_spec,
           "--port", str(port), "--workers", str(workers)]  # fmt: skip
    env = {**os.environ, "ROLLWAY_ADMIN_KEY": admin_key}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()) from None  # type: ignore[union-attr]
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("gateway did not start")


async def measure(
    spec: str, workers: int, concurrencies: list[int], rollouts_per_slot: int
) -> list[Row]:
    admin_key = secrets.token_hex(8)
    proc, url = start_gateway(spec, admin_key, workers)
    rows = []
    try:
        # Idle connections are dropped before the server's keep-alive (5 s) can close one
        # under a request (the front sees only registrations: its connections idle).
        connector = aiohttp.TCPConnector(limit=1024, keepalive_timeout=2)
        async with aiohttp.ClientSession(connector=connector) as session:
            turn = registered_turns(session, url, admin_key)
            await drive(turn, 16, 16)  # warm: connections, first renders
            tree = psutil.Process(proc.pid)
            for concurrency in concurrencies:
                front_before, workers_before = cpu_s(tree)
                run = await drive(turn, concurrency * rollouts_per_slot, concurrency)
                front_after, workers_after = cpu_s(tree)
                cpu = (front_after - front_before, workers_after - workers_before)
                rows.append(Row(workers, concurrency, run, *cpu))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if proc.stderr is not None:
            proc.stderr.close()
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one rollout per slot, not four")
    parser.add_argument("--workers", type=int, default=2, help="against one process")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--latency-s", type=float, default=0.0, help="simulated engine latency")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[Row]:
    spec = f"sim://?latency_s={args.latency_s}&output_len=16"
    per_slot = 1 if args.quick else 4
    rows: list[Row] = []
    for workers in (1, args.workers):
        rows += asyncio.run(measure(spec, workers, args.concurrency, per_slot))
    return rows


def main() -> None:
    args = parse()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; simulated engine at "
          f"{args.latency_s * 1000:.0f} ms per turn; {TURNS}-turn tool conversations")  # fmt: skip
    rows = run(args)
    one = {row.concurrency: row.run.turns_per_s for row in rows if row.workers == 1}
    for row in rows:
        print(
            f"  workers {row.workers}  concurrency {row.concurrency:>3}  "
            f"{row.run.turns_per_s:7.0f} turns/s  p50 {row.run.pct(0.5):7.2f} ms  "
            f"p99 {row.run.pct(0.99):7.2f} ms  to one process "
            f"{row.run.turns_per_s / one[row.concurrency]:4.2f}x  CPU ms/turn: port process "
            f"{row.cpu_ms_per_turn(row.front_cpu_s):.2f}, workers "
            f"{row.cpu_ms_per_turn(row.workers_cpu_s):.2f}"
        )
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
