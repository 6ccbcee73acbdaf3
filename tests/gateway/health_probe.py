"""Probe a served gateway's /health while another request runs: is the event loop free?"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Probed:
    response: httpx.Response
    elapsed_s: float
    #: Latency of each /health call made while the request ran.
    health_s: list[float]


def while_probing_health(url: str, send: Callable[[], httpx.Response]) -> Probed:
    """Run ``send`` in a thread and call ``url``/health back to back until it returns.

    The cyclic garbage collector is off meanwhile: a full collection of this test process's
    heap (torch, transformers, pytest) pauses every thread for ~0.4 s, whatever the gateway
    does, and the probe is about the gateway."""
    latencies: list[float] = []
    gc.disable()
    try:
        with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=url, timeout=30.0) as client:
            started = time.perf_counter()
            pending = pool.submit(send)
            while not pending.done():
                before = time.perf_counter()
                assert client.get("/health").status_code == 200
                latencies.append(time.perf_counter() - before)
            response = pending.result()
    finally:
        gc.enable()
    return Probed(response, time.perf_counter() - started, latencies)
