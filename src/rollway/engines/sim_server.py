"""A simulated SGLang server: the ``/generate`` and ``/abort_request`` protocol as SGLang
documents it, backed by the simulated engine, with fault injection. It is a load generator
and a fault injector for tests of remote-engine protocols, never a model.

It counts generations per request id (``GET /rollway/stats``) so tests can prove that a
request ran exactly once and that nothing is left running after an abort.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rollway.engines.sim import SimConfig, SimEngine
from rollway.types import SamplingParams

Fault = Literal["none", "drop", "5xx", "hang"]


@dataclass
class SimServerState:
    """What the server did, for tests: generations started per rid, aborts, what runs now."""

    generations: Counter[str] = field(default_factory=Counter)
    aborted: list[str] = field(default_factory=list)
    in_flight: set[str] = field(default_factory=set)
    faults_left: int = 0
    #: Set whenever a generation starts (for tests that wait for one to be running).
    started: asyncio.Event = field(default_factory=asyncio.Event)


def create_sim_server_app(
    config: SimConfig | None = None, *, fault: Fault = "none", fault_count: int = 1 << 30
) -> Starlette:
    """``fault`` hits the first ``fault_count`` generate calls: ``drop`` cuts the response
    mid-body, ``5xx`` answers 503 after generating, ``hang`` never finishes until aborted."""
    engine = SimEngine(config or SimConfig())
    hanging = SimEngine(SimConfig(latency_s=24 * 3600.0))
    state = SimServerState(faults_left=fault_count if fault != "none" else 0)

    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or not input_ids:
            return JSONResponse({"error": "input_ids must be a non-empty list"}, status_code=400)
        rid = body.get("rid") or uuid.uuid4().hex
        sampling = _sampling(body.get("sampling_params") or {})
        this_fault: Fault = "none"
        if state.faults_left > 0:
            state.faults_left -= 1
            this_fault = fault
        state.generations[rid] += 1
        state.in_flight.add(rid)
        state.started.set()
        try:
            chosen = hanging if this_fault == "hang" else engine
            result = await chosen.generate(input_ids, sampling, rid)
        finally:
            state.in_flight.discard(rid)
        if this_fault == "5xx":
            return JSONResponse({"error": "simulated overload"}, status_code=503)
        payload = orjson.dumps(_answer(rid, input_ids, result))
        if this_fault == "drop":
            return _Dropped(payload)
        return Response(payload, media_type="application/json")

    async def abort_request(request: Request) -> Response:
        rid = orjson.loads(await request.body()).get("rid", "")
        state.aborted.append(rid)
        await engine.abort(rid)
        await hanging.abort(rid)
        return JSONResponse({"success": True})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                "generations": dict(state.generations),
                "aborted": state.aborted,
                "in_flight": sorted(state.in_flight),
            }
        )

    async def wait_in_flight(request: Request) -> Response:
        """Answers once a generation is running (or after 30 s): a long poll for tests."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.started.wait(), 30.0)
        return await stats(request)

    app = Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/abort_request", abort_request, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/rollway/stats", stats, methods=["GET"]),
            Route("/rollway/wait_in_flight", wait_in_flight, methods=["GET"]),
        ]
    )
    app.state.sim = state
    return app


def _sampling(params: dict[str, Any]) -> SamplingParams:
    top_k = int(params.get("top_k", -1))
    return SamplingParams(
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=max(top_k, 0),
        max_tokens=params.get("max_new_tokens", 128),
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        seed=params.get("sampling_seed"),
    )


def _answer(rid: str, input_ids: list[int], result: Any) -> dict[str, Any]:
    finish: dict[str, Any] = {"type": result.finish_reason}
    if result.finish_reason == "length":
        finish["length"] = len(result.output_ids)
    return {
        "text": "",
        "output_ids": result.output_ids,
        "meta_info": {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(result.output_ids),
            "output_token_logprobs": [
                [lp, tid, None] for lp, tid in zip(result.logprobs, result.output_ids, strict=True)
            ],
        },
    }


class _Dropped(Response):
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
