"""Several engine endpoints behind one engine: rollout-sticky, least-loaded, health-checked.

All turns of a rollout go to the endpoint that served its first turn while that endpoint is
healthy and not overloaded (its prefix cache holds the conversation). A new rollout goes to the
endpoint with the fewest in-flight requests, then tokens. An endpoint is ejected after
``eject_after`` failed health checks or connect failures in a row and re-admitted after
``readmit_after`` good checks; ejections and re-admissions are logged and counted.

The rollout a request belongs to is read from its id: the gateway names requests
``<rollout_id>-<turn>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rollway.engines.base import Engine
from rollway.errors import EngineConnectError, EngineError
from rollway.types import GenerationResult, SamplingParams

log = logging.getLogger(__name__)


def rollout_of(request_id: str) -> str:
    return request_id.rsplit("-", 1)[0]


@dataclass
class Endpoint:
    name: str
    engine: Engine
    healthy: bool = True
    failures: int = 0
    successes: int = 0
    in_flight: int = 0
    in_flight_tokens: int = 0
    served: int = 0
    ejections: int = 0
    readmissions: int = 0

    @property
    def load(self) -> tuple[int, int]:
        return (self.in_flight, self.in_flight_tokens)


class RoutedEngine:
    def __init__(
        self,
        engines: Sequence[Engine],
        names: Sequence[str] | None = None,
        *,
        health_interval_s: float = 5.0,
        eject_after: int = 3,
        readmit_after: int = 2,
        overload_margin: int = 64,
        affinity: Callable[[str], str] = rollout_of,
    ) -> None:
        if not engines:
            raise EngineError("a routed engine needs at least one endpoint")
        labels = names or [f"endpoint-{i}" for i in range(len(engines))]
        self.endpoints = [Endpoint(n, e) for n, e in zip(labels, engines, strict=True)]
        self.health_interval_s = health_interval_s
        self.eject_after, self.readmit_after = eject_after, readmit_after
        self.overload_margin = overload_margin
        self._affinity = affinity
        self._sticky: dict[str, Endpoint] = {}
        self._running: dict[str, Endpoint] = {}
        self._checker: asyncio.Task[None] | None = None
        self.sticky_hits = 0
        self.moves = 0

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self._start_health_checks()
        endpoint = self._choose(self._affinity(request_id))
        endpoint.in_flight += 1
        endpoint.in_flight_tokens += len(input_ids)
        self._running[request_id] = endpoint
        try:
            result = await endpoint.engine.generate(input_ids, sampling, request_id)
        except EngineConnectError:
            self._record_check(endpoint, ok=False)
            raise
        finally:
            endpoint.in_flight -= 1
            endpoint.in_flight_tokens -= len(input_ids)
            self._running.pop(request_id, None)
        endpoint.served += 1
        return result

    async def abort(self, request_id: str) -> None:
        endpoint = self._running.get(request_id)
        if endpoint is not None:
            await endpoint.engine.abort(request_id)

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        for endpoint in self.endpoints:
            await endpoint.engine.close()

    async def check_health(self) -> None:
        """One round of health checks on every endpoint (the loop calls this periodically)."""
        results = await asyncio.gather(*[_healthy(e.engine) for e in self.endpoints])
        for endpoint, ok in zip(self.endpoints, results, strict=True):
            self._record_check(endpoint, ok)

    def stats(self) -> dict[str, Any]:
        return {
            "sticky_hits": self.sticky_hits,
            "moves": self.moves,
            "endpoints": {
                e.name: {
                    "healthy": e.healthy,
                    "in_flight": e.in_flight,
                    "served": e.served,
                    "ejections": e.ejections,
                    "readmissions": e.readmissions,
                }
                for e in self.endpoints
            },
        }

    def _choose(self, rollout: str) -> Endpoint:
        healthy = [e for e in self.endpoints if e.healthy]
        if not healthy:
            raise EngineError("no healthy engine endpoint")
        least = min(healthy, key=lambda e: e.load)
        current = self._sticky.get(rollout)
        overloaded = current is not None and (
            current.in_flight >= least.in_flight + self.overload_margin
        )
        if current is not None and current.healthy and not overloaded:
            self.sticky_hits += 1
            return current
        if current is not None:
            self.moves += 1
            log.info("rollout moved from %s to %s", current.name, least.name)
        self._sticky[rollout] = least
        return least

    def _record_check(self, endpoint: Endpoint, ok: bool) -> None:
        if ok:
            endpoint.failures = 0
            endpoint.successes += 1
            if not endpoint.healthy and endpoint.successes >= self.readmit_after:
                endpoint.healthy = True
                endpoint.readmissions += 1
                log.warning("engine endpoint %s re-admitted", endpoint.name)
            return
        endpoint.successes = 0
        endpoint.failures += 1
        if endpoint.healthy and endpoint.failures >= self.eject_after:
            endpoint.healthy = False
            endpoint.ejections += 1
            log.warning(
                "engine endpoint %s ejected after %d failures", endpoint.name, endpoint.failures
            )

    def _start_health_checks(self) -> None:
        if self._checker is None or self._checker.done():
            self._checker = asyncio.create_task(self._check_forever())

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_health()


async def _healthy(engine: Engine) -> bool:
    check = getattr(engine, "health", None)
    if check is None:
        return True
    try:
        return bool(await check())
    except Exception:
        return False
