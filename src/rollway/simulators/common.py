"""What every simulated server shares: fault injection, per-request counting, generation on
the simulated engine, the test routes (``/rollway/stats``, long polls) and the response helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rollway.engines.sim import SimConfig, SimEngine
from rollway.types import GenerationResult, SamplingParams

Fault = Literal["none", "drop", "5xx", "hang"]


@dataclass
class SimServerState:
    """What the server did, for tests: generations started per rid, aborts, what runs now."""

    generations: Counter[str] = field(default_factory=Counter)
    aborted: list[str] = field(default_factory=list)
    in_flight: set[str] = field(default_factory=set)
    faults_left: int = 0
    #: Set whenever a generation starts / while none runs (for tests that wait on either).
    started: asyncio.Event = field(default_factory=asyncio.Event)
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class Simulator:
    """The shared part: fault choice, counting, generation, abort."""

    def __init__(self, config: SimConfig, fault: Fault, fault_count: int) -> None:
        self.engine = SimEngine(config)
        self.hanging = SimEngine(SimConfig(latency_s=24 * 3600.0))
        self.fault = fault
        self.state = SimServerState(faults_left=fault_count if fault != "none" else 0)

    def next_fault(self) -> Fault:
        if self.state.faults_left <= 0:
            return "none"
        self.state.faults_left -= 1
        return self.fault

    async def generate(
        self, rid: str, input_ids: list[int], sampling: SamplingParams, fault: Fault
    ) -> GenerationResult:
        state = self.state
        state.generations[rid] += 1
        state.in_flight.add(rid)
        state.started.set()
        state.idle.clear()
        try:
            chosen = self.hanging if fault == "hang" else self.engine
            return await chosen.generate(input_ids, sampling, rid)
        finally:
            state.in_flight.discard(rid)
            if not state.in_flight:
                state.idle.set()

    async def abort(self, rid: str) -> None:
        self.state.aborted.append(rid)
        await self.engine.abort(rid)
        await self.hanging.abort(rid)

    def respond(self, payload: dict[str, Any], fault: Fault) -> Response:
        if fault == "5xx":
            return JSONResponse({"error": "simulated overload"}, status_code=503)
        body = orjson.dumps(payload)
        return Dropped(body) if fault == "drop" else Response(body, media_type="application/json")


def test_routes(sim: Simulator) -> list[Route]:
    """Routes for tests, on every simulated server: what ran, and long polls to wait on it."""

    async def stats(request: Request) -> Response:
        state = sim.state
        return JSONResponse(
            {
                "generations": dict(state.generations),
                "aborted": state.aborted,
                "in_flight": sorted(state.in_flight),
            }
        )

    async def wait_in_flight(request: Request) -> Response:
        """Answers once a generation is running (or after 30 s)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sim.state.started.wait(), 30.0)
        return await stats(request)

    async def wait_idle(request: Request) -> Response:
        """Answers once no generation runs (or after 30 s)."""
        if sim.state.in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sim.state.idle.wait(), 30.0)
        return await stats(request)

    return [
        Route("/rollway/stats", stats, methods=["GET"]),
        Route("/rollway/wait_in_flight", wait_in_flight, methods=["GET"]),
        Route("/rollway/wait_idle", wait_idle, methods=["GET"]),
    ]


async def generate_until_disconnect(
    request: Request,
    sim: Simulator,
    rid: str,
    prompt: list[int],
    sampling: SamplingParams,
    fault: Fault,
) -> GenerationResult:
    """Generate, aborting if the client disconnects first (as vLLM and hosted APIs do)."""
    generation = asyncio.create_task(sim.generate(rid, prompt, sampling, fault))
    watcher = asyncio.create_task(_abort_on_disconnect(request, sim, rid))
    try:
        return await generation
    finally:
        watcher.cancel()


async def _abort_on_disconnect(request: Request, sim: Simulator, rid: str) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    if rid in sim.state.in_flight:
        await sim.abort(rid)


def sampling_from(params: dict[str, Any], max_tokens: Any, seed: Any) -> SamplingParams:
    return SamplingParams(
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=max(int(params.get("top_k", -1)), 0),
        max_tokens=int(max_tokens) if max_tokens is not None else 128,
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        seed=seed,
    )


class Dropped(Response):
    """Promises more bytes than it sends, then ends: the client sees a cut connection."""

    def __init__(self, payload: bytes) -> None:
        super().__init__(payload, media_type="application/json")
        self._payload = payload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._payload) * 2).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self._payload[:10], "more_body": True})
        # Returning with the body unfinished makes the server close the connection.
