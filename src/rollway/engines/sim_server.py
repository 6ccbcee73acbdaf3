"""Simulated inference servers: SGLang's native API (``/generate``, ``/abort_request``),
vLLM's token-in/token-out completions (``/v1/completions``, aborted by disconnect) and a plain
OpenAI chat-completions API, backed by the simulated engine, with fault injection. Load
generators and fault injectors for tests of remote-engine protocols, never a model.

Each counts generations per request id (``GET /rollway/stats``) so tests can prove that a
request ran exactly once and that nothing is left running after an abort.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
from rollway.types import GenerationResult, SamplingParams

Fault = Literal["none", "drop", "5xx", "hang"]
Protocol = Literal["sglang", "vllm", "openai"]


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


class _Simulator:
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
        return _Dropped(body) if fault == "drop" else Response(body, media_type="application/json")


def create_sim_server_app(
    config: SimConfig | None = None,
    *,
    protocol: Protocol = "sglang",
    fault: Fault = "none",
    fault_count: int = 1 << 30,
) -> Starlette:
    """``fault`` hits the first ``fault_count`` generate calls: ``drop`` cuts the response
    mid-body, ``5xx`` answers 503 after generating, ``hang`` never finishes until aborted."""
    sim = _Simulator(config or SimConfig(), fault, fault_count)

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
        """Answers once a generation is running (or after 30 s): a long poll for tests."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sim.state.started.wait(), 30.0)
        return await stats(request)

    async def wait_idle(request: Request) -> Response:
        """Answers once no generation runs (or after 30 s): a long poll for tests."""
        if sim.state.in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sim.state.idle.wait(), 30.0)
        return await stats(request)

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    routes = {"sglang": _sglang_routes, "vllm": _vllm_routes, "openai": _openai_routes}[protocol](
        sim
    )
    routes += [
        Route("/health", health, methods=["GET"]),
        Route("/rollway/stats", stats, methods=["GET"]),
        Route("/rollway/wait_in_flight", wait_in_flight, methods=["GET"]),
        Route("/rollway/wait_idle", wait_idle, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.state.sim = sim.state
    return app


def _sglang_routes(sim: _Simulator) -> list[Route]:
    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or not input_ids:
            return JSONResponse({"error": "input_ids must be a non-empty list"}, status_code=400)
        rid = body.get("rid") or uuid.uuid4().hex
        params = body.get("sampling_params") or {}
        sampling = _sampling(params, params.get("max_new_tokens"), params.get("sampling_seed"))
        fault = sim.next_fault()
        result = await sim.generate(rid, input_ids, sampling, fault)
        finish: dict[str, Any] = {"type": result.finish_reason}
        pairs = [[lp, t, None] for lp, t in zip(result.logprobs, result.output_ids, strict=True)]
        meta = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(result.output_ids),
            "output_token_logprobs": pairs,
        }
        return sim.respond({"text": "", "output_ids": result.output_ids, "meta_info": meta}, fault)

    async def abort_request(request: Request) -> Response:
        await sim.abort(orjson.loads(await request.body()).get("rid", ""))
        return JSONResponse({"success": True})

    return [
        Route("/generate", generate, methods=["POST"]),
        Route("/abort_request", abort_request, methods=["POST"]),
    ]


def _vllm_routes(sim: _Simulator) -> list[Route]:
    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not body.get("return_token_ids"):
            error = "prompt must be token ids and return_token_ids true"
            return JSONResponse({"error": error}, status_code=400)
        rid = body.get("request_id") or uuid.uuid4().hex
        sampling = _sampling(body, body.get("max_tokens"), body.get("seed"))
        fault = sim.next_fault()
        result = await _generate_until_disconnect(request, sim, rid, prompt, sampling, fault)
        logprobs = {
            "tokens": [f"token_id:{t}" for t in result.output_ids],
            "token_logprobs": result.logprobs,
            "top_logprobs": None,
            "text_offset": [0] * len(result.output_ids),
        }
        choice = {
            "index": 0,
            "text": "",
            "logprobs": logprobs,
            "finish_reason": result.finish_reason,
            "token_ids": result.output_ids,
            "prompt_token_ids": prompt,
        }
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(result.output_ids)}
        payload = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or "sim",
            "choices": [choice],
            "usage": usage,
        }
        return sim.respond(payload, fault)

    return [Route("/v1/completions", completions, methods=["POST"])]


def _openai_routes(sim: _Simulator) -> list[Route]:
    async def chat_completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not body.get("model"):
            return JSONResponse({"error": "messages and model are required"}, status_code=400)
        rid = uuid.uuid4().hex
        # The simulated "prompt" is a digest of the messages: the same chat gets the same answer.
        prompt = list(orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)[-64:])
        sampling = _sampling(body, body.get("max_tokens"), body.get("seed"))
        fault = sim.next_fault()
        result = await _generate_until_disconnect(request, sim, rid, prompt, sampling, fault)
        words = [f"tok{t}" for t in result.output_ids]
        entries = [{"token": w, "logprob": lp, "bytes": None, "top_logprobs": []}
                   for w, lp in zip(words, result.logprobs, strict=True)]  # fmt: skip
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": " ".join(words)},
            "finish_reason": result.finish_reason,
            "logprobs": {"content": entries} if body.get("logprobs") else None,
        }
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(words),
            "total_tokens": len(prompt) + len(words),
        }
        payload = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [choice],
            "usage": usage,
        }
        return sim.respond(payload, fault)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]


async def _generate_until_disconnect(
    request: Request,
    sim: _Simulator,
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


async def _abort_on_disconnect(request: Request, sim: _Simulator, rid: str) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    if rid in sim.state.in_flight:
        await sim.abort(rid)


def _sampling(params: dict[str, Any], max_tokens: Any, seed: Any) -> SamplingParams:
    return SamplingParams(
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=max(int(params.get("top_k", -1)), 0),
        max_tokens=int(max_tokens) if max_tokens is not None else 128,
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        seed=seed,
    )


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
