"""`rollway gateway --workers N` against one process: turns/s of multi-turn tool conversations
at 64 and 256 concurrent rollouts over the simulated engine, the gateway served as in
production (`rollway gateway` subprocesses on loopback, an aiohttp client in this process).

The client, the front, the workers and their simulated engines all share this machine's
cores: on a machine with fewer cores than workers + 2 the figures say what the front costs
more than what the workers add.

Usage: python benchmarks/gateway_workers.py [--quick] [--workers 2] [--latency-s 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp
from benchmarks.gateway_overhead import Run, drive, http_turns

CONCURRENCY = (64, 256)


@dataclass(frozen=True)
class Row:
    workers: int
    concurrency: int
    run: Run


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
        connector = aiohttp.TCPConnector(limit=1024)
        async with aiohttp.ClientSession(connector=connector) as session:
            turn = http_turns(session, url, admin_key)
            await drive(turn, 16, 16)  # warm: connections, first renders
            for concurrency in concurrencies:
                run = await drive(turn, concurrency * rollouts_per_slot, concurrency)
                rows.append(Row(workers, concurrency, run))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
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
    print(f"{os.cpu_count()} cores; simulated engine at {args.latency_s * 1000:.0f} ms per turn")
    rows = run(args)
    one = {row.concurrency: row.run.turns_per_s for row in rows if row.workers == 1}
    for row in rows:
        print(
            f"  workers {row.workers}  concurrency {row.concurrency:>3}  "
            f"{row.run.turns_per_s:7.0f} turns/s  p50 {row.run.pct(0.5):7.2f} ms  "
            f"p99 {row.run.pct(0.99):7.2f} ms  to one process "
            f"{row.run.turns_per_s / one[row.concurrency]:4.2f}x"
        )


if __name__ == "__main__":
    main()
