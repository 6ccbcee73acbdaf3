"""What is gateway-wide behind ``--workers``: the policy's weights, pauses and metrics reach
every worker, and a worker started again is brought up to the weights the others sample
before it takes a rollout (else its tokens would carry an old version, a wrong answer).

An update pauses every worker first, loads the weights into each in turn within that pause
(one worker's answer fixes the version the others load as), and resumes them all: no worker
samples new weights while another still samples old ones under the same version."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from rollway.engines.base import PauseMode
from rollway.errors import InfrastructureError, RollwayError, error_from_body
from rollway.gateway.weight_control import NewWeights, WeightUpdate, checked_mode, served_body
from rollway.gateway.workers.proxy import call_json
from rollway.gateway.workers.worker_pool import Worker, WorkerPool


class WorkerWeights:
    """The weights every worker samples: the last update and the pause in force (to replay on
    a restarted worker), changed one at a time (``lock``)."""

    def __init__(self, pool: WorkerPool, admin_key: str) -> None:
        self.pool, self.admin_key = pool, admin_key
        self.last_update: NewWeights | None = None
        self.paused: PauseMode | None = None
        self.lock = asyncio.Lock()
        pool.catch_up = self.catch_up

    async def update(self, new: NewWeights) -> WeightUpdate:
        async with self.lock:
            held = self.paused  # the caller's own pause, if it made one
            started = time.perf_counter()
            if held is None:
                await self._on_all("POST", "/admin/pause", {"mode": new.mode})
            paused = time.perf_counter()
            try:
                version = new.version
                for worker in self._up():
                    answer = await self._call(worker, "POST", "/admin/weights", served_body(new))
                    version = WeightUpdate.from_dict(answer).version
                    new = dataclasses.replace(new, version=version)
            finally:
                if held is None:
                    await self._on_all("POST", "/admin/resume")
            self.last_update = new
            done = time.perf_counter()
        if version is None:
            raise InfrastructureError("no gateway worker is up to take the weights")
        return WeightUpdate(version, held or new.mode, paused - started, done - paused)

    async def pause(self, body: dict[str, Any]) -> Any:
        async with self.lock:
            answers = await self._on_all("POST", "/admin/pause", body)
            self.paused = checked_mode(body.get("mode") or "abort")  # the workers took it
        return answers[0]

    async def resume(self) -> Any:
        async with self.lock:
            answers = await self._on_all("POST", "/admin/resume")
            self.paused = None
        return answers[0]

    async def catch_up(self, worker: Worker) -> None:
        """A worker started again loads the last weights and takes the pause in force; an
        error here fails its start (it is started again)."""
        async with self.lock:
            if self.last_update is not None:
                await self._call(worker, "POST", "/admin/weights", served_body(self.last_update))
            if self.paused is not None:
                await self._call(worker, "POST", "/admin/pause", {"mode": self.paused})

    async def _on_all(self, method: str, path: str, body: Any = None) -> list[Any]:
        calls = [self._call(w, method, path, body) for w in self._up()]
        return list(await asyncio.gather(*calls))

    def _up(self) -> list[Worker]:
        # One being started again is brought up to date by ``catch_up`` (under the lock).
        return [worker for worker in self.pool.workers if worker.up]

    async def _call(self, worker: Worker, method: str, path: str, body: Any = None) -> Any:
        status, answer = await call_json(worker, method, path, self.admin_key, body)
        if status >= 400:
            raise _from_worker(worker, status, answer)
        return answer


def _from_worker(worker: Worker, status: int, answer: Any) -> RollwayError:
    error = error_from_body(status, answer)
    error.message = f"gateway worker {worker.index}: {error.message}"
    error.args = (error.message, *error.args[1:])
    return error


def merge_metrics(texts: list[str]) -> str:
    """The workers' Prometheus texts as one: each sample labelled with its ``worker``, each
    family's HELP and TYPE once, its samples together (as the format requires)."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    for index, text in enumerate(texts):
        current: tuple[list[str], list[str]] | None = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                current = families.setdefault(name, ([], []))
                if line not in current[0]:
                    current[0].append(line)
            elif line and not line.startswith("#") and current is not None:
                current[1].append(_labelled(line, index))
    lines = [line for header, samples in families.values() for line in (*header, *samples)]
    return "\n".join(lines) + "\n"


def _labelled(sample: str, worker: int) -> str:
    label = f'worker="{worker}"'
    name, brace, rest = sample.partition("{")
    if brace:
        return f"{name}{{{label},{rest}" if not rest.startswith("}") else f"{name}{{{label}{rest}"
    name, space, value = sample.partition(" ")
    return f"{name}{{{label}}}{space}{value}"
