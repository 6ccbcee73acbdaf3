"""What a test asks a Ray worker's own engine, run in the worker by Ray's ``__ray_call__``
(``ray.get(actor.__ray_call__.remote(probe))``): the ``sim`` engine's requests in flight, and
where in memory the weights it was given lie. Importable by name on the workers."""

from __future__ import annotations

import time
from typing import Any

from rollway.engines.sim import SimEngine


def sim_engine(worker: Any) -> SimEngine:
    """The ``sim`` engine behind a ``RolloutWorker``'s own gateway."""
    engine = worker._executor.gateway.gateway.engine
    assert isinstance(engine, SimEngine)
    return engine


def least_done(worker: Any) -> tuple[int, float]:
    """The engine's generations in flight, and the smallest share of its wait one has done
    (1.0 when none)."""
    running = list(sim_engine(worker)._running.values())
    now = time.monotonic()  # one clock for every process on this machine (CLOCK_MONOTONIC)
    shares = [(now - r.started) / r.delay for r in running if r.delay > 0]
    return len(running), min(shares, default=1.0)


def weights_memory(worker: Any) -> list[dict[str, Any]]:
    """For each update the engine took: its version, and where the first array's bytes lie:
    the file mapped there (a node's object store is one shared-memory file), its device and
    inode, the offset in it, and whether the array is writable (a private copy would be)."""
    found = []
    for source, version in sim_engine(worker).updates:
        array = next(iter(source.values()))
        address = array.__array_interface__["data"][0]
        found.append({"version": version, "writable": array.flags.writeable, **mapped(address)})
    return found


def mapped(address: int) -> dict[str, Any]:
    """The mapping of this process holding ``address`` (``/proc/self/maps``)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, _, offset, device, inode, *path = line.split(maxsplit=5)
            low, high = (int(end, 16) for end in span.split("-"))
            if low <= address < high:
                return {
                    "file": path[0].strip() if path else "",
                    "device": device,
                    "inode": int(inode),
                    "offset": int(offset, 16) + address - low,
                }
    raise AssertionError(f"address {address:#x} is in no mapping")
