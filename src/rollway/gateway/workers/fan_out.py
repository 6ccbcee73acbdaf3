"""What is gateway-wide behind ``--workers``: the policy's weights, pauses and metrics reach
every worker, and a worker started again is brought up to the weights the others sample
before it takes a rollout (else its tokens would carry an old version, a wrong answer).

An update pauses every worker first, loads the weights within that pause (one worker's answer
fixes the version the others take), and resumes them all: no worker samples new weights while
another still samples old ones under the same version. Workers whose engine is a shared server
(``engine_shared``: a remote engine) have the first load it and the others adopt the version
(``loaded``), so the server loads each update once, not once per worker; the loader resumes
first, once every other worker stamps the new version."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from rollway.engines.base import PauseMode
from rollway.errors import InfrastructureError, RollwayError, error_from_body
from rollway.gateway.weight_control import (
    NewWeights,
    PolicyState,
    WeightUpdate,
    checked_mode,
    served_body,
)
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
        self._shared: bool | None = None  # the workers' engine is a shared server: asked once
        pool.catch_up = self.catch_up

    async def update(self, new: NewWeights) -> WeightUpdate:
        async with self.lock:
            held = self.paused  # the caller's own pause, if it made one
            started = time.perf_counter()
            if held is None:
                await self._on_all("POST", "/admin/pause", {"mode": new.mode})
            paused = time.perf_counter()
            try:
                answer, new = await self._load(new)
            finally:
                if held is None:
                    await self._resume_all()
            self.last_update = new
            done = time.perf_counter()
        return dataclasses.replace(
            answer, mode=held or new.mode, pause_s=paused - started, load_s=done - paused
        )

    async def pause(self, body: dict[str, Any]) -> Any:
        async with self.lock:
            answers = await self._on_all("POST", "/admin/pause", body)
            self.paused = checked_mode(body.get("mode") or "abort")  # the workers took it
        return answers[0]

    async def resume(self) -> Any:
        async with self.lock:
            answers = await self._resume_all()
            self.paused = None
        return answers[0]

    async def catch_up(self, worker: Worker) -> None:
        """A worker started again takes the last weights (adopts them, from a shared server
        that holds them already) and the pause in force; an error here fails its start (it
        is started again)."""
        async with self.lock:
            if self.last_update is not None:
                shared = await self._engine_shared(worker)
                update = dataclasses.replace(self.last_update, loaded=shared)
                await self._call(worker, "POST", "/admin/weights", served_body(update))
            if self.paused is not None:
                await self._call(worker, "POST", "/admin/pause", {"mode": self.paused})

    async def _load(self, new: NewWeights) -> tuple[WeightUpdate, NewWeights]:
        """Load ``new`` into the first worker up, then each other: by a load of its own, or
        by adopting the version when the engine is a server they share. The first's answer,
        and the update as it was done (its version fixed)."""
        first, *others = self._up_or_fail()
        answer = await self._call(first, "POST", "/admin/weights", served_body(new))
        update = WeightUpdate.from_dict(answer)
        new = dataclasses.replace(new, version=update.version)
        adopted = dataclasses.replace(new, loaded=await self._engine_shared(first))
        for worker in others:
            await self._call(worker, "POST", "/admin/weights", served_body(adopted))
        return update, new

    async def _engine_shared(self, worker: Worker) -> bool:
        if self._shared is None:
            policy = await self._call(worker, "GET", "/admin/policy")
            self._shared = PolicyState.from_dict(policy).engine_shared
        return self._shared

    async def _resume_all(self) -> list[Any]:
        """The first worker (the one that loaded) resumes first: on a shared server its resume
        lets the server sample again, once every worker stamps the new version."""
        first, *others = self._up_or_fail()
        answers = [await self._call(first, "POST", "/admin/resume")]
        answers += await asyncio.gather(*(self._call(w, "POST", "/admin/resume") for w in others))
        return answers

    async def _on_all(self, method: str, path: str, body: Any = None) -> list[Any]:
        calls = [self._call(w, method, path, body) for w in self._up()]
        return list(await asyncio.gather(*calls))

    def _up(self) -> list[Worker]:
        # One being started again is brought up to date by ``catch_up`` (under the lock).
        return [worker for worker in self.pool.workers if worker.up]

    def _up_or_fail(self) -> list[Worker]:
        up = self._up()
        if not up:
            raise InfrastructureError("no gateway worker is up: each is being started again")
        return up

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
