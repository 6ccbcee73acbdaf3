"""A simulated SGLang server (or, with ``router=True``, an sgl-router / sgl-model-gateway in
front of one), answering as the real one does, quirks included. Sources, sgl-project/sglang:
``python/sglang/srt/entrypoints/http_server.py`` (routes), ``managers/tokenizer_manager.py``
(pause gate, aborts, ``weight_version``), ``managers/io_struct.py`` (request bodies),
``sampling/sampling_params.py`` (defaults), ``layers/sampler.py`` (logprobs),
``utils/weight_versions.py`` (per-token spans), ``sgl-router/src/server.rs`` and
``sgl-model-gateway/src/server.rs`` (router routes).

Reproduced, so that a client bug fails a test:

- ``max_new_tokens`` defaults to 128 when absent (``SamplingParams``); a prompt that fills the
  context, or ``input + max_new_tokens >= context_length``, is refused with 400
  (``TokenizerManager._validate_one_request``).
- Logprobs come after temperature scaling (``log_softmax(logits / T)``) unless the server runs
  with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (``original_logprobs``); greedy (``T < 1e-6``,
  turned into ``T=1, top_k=1``) and ``T == 1`` give raw ones. Simulated as ``logprob / T``.
- ``/abort_request`` answers 200 with an empty body; it aborts only if the rid is known, and
  then every running rid that *starts with* it (the scheduler matches by prefix).
- ``/health`` is ``health_generate``: it waits for any output, polling each second, and answers
  503 after ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) without one, which is always the case while
  generation is paused. ``/get_model_info`` answers at once.
- Generate calls made while paused wait at the server (``is_pause_cond``); ``/pause_generation``
  takes ``mode`` ``abort`` (abort all, return when none runs), ``retract`` or ``in_place``
  (freeze, continue after ``/continue_generation``). ``/update_weights_from_disk`` refuses a
  path it cannot read (400, ``success: false``), waits for running requests unless paused, moves
  ``weight_version`` when given one, and flushes the cache, which fails (500) while ``in_place``
  holds frozen requests (the scheduler's ``assert flush_cache_success``).
- With an API key, every route but ``/health*`` and ``/metrics`` wants ``Bearer <key>`` (401).
- Versions (``version``): before 0.5.3 ``sampling_seed`` is an unknown keyword of
  ``SamplingParams(**params)``, a ``TypeError`` FastAPI turns into a plain 500; before 0.5.6
  ``/pause_generation`` has no body (the mode is ignored: it always aborts); aborts of that age
  carry no logprobs; numbered versions report one ``weight_version`` per answer, ``latest``
  also per-token ``weight_versions`` spans.
- ``"stream": true`` (``http_server.py`` ``generate_request``): ``data: <json>`` events, one per
  ``stream_interval`` tokens (``server_args.py``: 1), then ``data: [DONE]``. By default each event
  repeats the whole output so far, ``output_ids`` and ``meta_info.output_token_logprobs`` alike;
  with ``--incremental-streaming-output`` they hold only the new tokens
  (``tokenizer_manager_components/output_processor.py`` ``handle_batch_output``,
  ``logprob_ops.py`` ``slice_streaming_output_meta_info``), while ``completion_tokens`` and the
  ``weight_versions`` spans always cover the whole output. The last event has the finish reason
  and the last tokens; an abort's has the output so far. Inside a stream a ``ValueError`` (a
  prompt too long) is an ``{"error": {"message"}}`` event in a 200 answer, a scheduler error is a
  finish ``abort`` with its ``status_code`` (``_handle_abort_finish_reason`` yields it instead of
  raising), and any other exception (``sampling_seed`` before 0.5.3) escapes after the headers:
  the connection drops. A client that disconnects has its request aborted
  ``disconnect_abort_s`` (2 s, ``create_abort_task``) later.
- The router flavour has ``/generate``, ``/workers``, ``/list_workers``, ``/get_loads``,
  ``/flush_cache``, the info and health routes, and no ``/abort_request``, ``/pause_generation``
  or weight routes (404).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from rollway.engines.sim import SimConfig
from rollway.generation import GenerationResult, SamplingParams
from rollway.simulators.common import (
    DONE_EVENT,
    EventStreamResponse,
    Fault,
    RequireBearer,
    ServerVersion,
    Simulator,
    StreamedGeneration,
    StreamStep,
    closing_events,
    sampling_from,
    sse_event,
    test_routes,
)

#: SGLang's ``_SAMPLING_EPS``: a lower temperature is greedy (sampled at T=1, top_k=1).
SAMPLING_EPS = 1e-6
_PAUSE_MODES = ("abort", "retract", "in_place")
_FLUSHED = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"  # noqa: E501


@dataclass(frozen=True)
class SGLangSimConfig:
    """How the simulated server is launched. ``version``: the release to imitate (``latest``
    or ``0.5.4`` ...); ``router``: answer as sgl-router listing ``workers``; ``api_key``: as
    ``--api-key``; ``original_logprobs``: as ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``;
    ``health_timeout_s``/``health_poll_s``: ``health_generate``'s 20 s and 1 s;
    ``incremental_streaming_output``, ``stream_interval``: as the server flags;
    ``disconnect_abort_s``: how long after a streaming client disconnects its request is
    aborted."""

    version: str = "latest"
    router: bool = False
    workers: tuple[str, ...] = ()
    api_key: str | None = None
    original_logprobs: bool = False
    context_length: int = 32768
    health_timeout_s: float = 20.0
    health_poll_s: float = 1.0
    incremental_streaming_output: bool = False
    stream_interval: int = 1
    disconnect_abort_s: float = 2.0


def create_app(
    config: SimConfig | None = None,
    options: SGLangSimConfig | None = None,
    *,
    fault: Fault = "none",
    fault_count: int = 1 << 30,
) -> Starlette:
    """A simulated SGLang server (or router) app; ``app.state.sim`` holds its counters."""
    options = options or SGLangSimConfig()
    sim = Simulator(config or SimConfig(), fault, fault_count)
    middleware = []
    if options.api_key:
        opened = ("/health", "/metrics", "/rollway/")
        middleware.append(Middleware(RequireBearer, api_key=options.api_key, open_prefixes=opened))
    app = Starlette(routes=routes(sim, options) + test_routes(sim), middleware=middleware)
    app.state.sim = sim.state
    app.state.simulator = sim
    return app


def routes(sim: Simulator, options: SGLangSimConfig | None = None) -> list[Route]:
    options = options or SGLangSimConfig()
    server = _Server(sim, options)
    common = [
        Route("/generate", server.generate, methods=["POST", "PUT"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/health_generate", server.health, methods=["GET"]),
        Route("/get_model_info", server.model_info, methods=["GET"]),
        Route("/get_server_info", server.server_info, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/flush_cache", server.flush_cache, methods=["GET", "POST"]),
    ]
    if options.router:  # sgl-router/src/server.rs build_app
        return [
            *common,
            Route("/liveness", _ok, methods=["GET"]),
            Route("/readiness", _ok, methods=["GET"]),
            Route("/workers", server.workers, methods=["GET"]),
            Route("/list_workers", server.list_workers, methods=["GET"]),
            Route("/get_loads", server.loads, methods=["GET"]),
        ]
    if server.version.latest:  # the renamed info routes
        common += [
            Route("/model_info", server.model_info, methods=["GET"]),
            Route("/server_info", server.server_info, methods=["GET"]),
        ]
    return [
        *common,
        Route("/abort_request", server.abort_request, methods=["POST"]),
        Route("/pause_generation", server.pause_generation, methods=["POST"]),
        Route("/continue_generation", server.continue_generation, methods=["POST"]),
        Route("/update_weights_from_disk", server.update_weights, methods=["POST"]),
        Route("/get_weight_version", server.weight_version, methods=["GET"]),
    ]


class _Server:
    def __init__(self, sim: Simulator, options: SGLangSimConfig) -> None:
        self.sim = sim
        self.options = options
        self.version = ServerVersion.parse(options.version)
        self.in_place_frozen = False
        #: Streams' generations left running after their client went (owned until they end).
        self.orphans: set[asyncio.Task[None]] = set()

    async def generate(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        if body.get("stream"):
            return self._stream(body)
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or not input_ids:
            return _error("input_ids must be a non-empty list")
        params = dict(body.get("sampling_params") or {})
        if "sampling_seed" in params and not self.version.at_least(0, 5, 3):
            # SamplingParams(**params) raises TypeError, which no handler catches.
            return PlainTextResponse("Internal Server Error", status_code=500)
        problem = self._length_problem(len(input_ids), params)
        if problem is not None:
            return _error(problem)
        rid = body.get("rid") or uuid.uuid4().hex
        sampling = self._sampling(params, len(input_ids))
        fault = self.sim.next_fault()
        result = await self.sim.generate(rid, input_ids, sampling, fault)
        labels = self.sim.token_labels(result)
        meta = self._meta_info(rid, len(input_ids), result, labels, _finish(result), body)
        answer = {"text": "", "output_ids": result.output_ids, "meta_info": meta}
        return self.sim.respond(answer, fault)

    def _sampling(self, params: dict[str, Any], prompt_len: int) -> SamplingParams:
        max_new = params.get("max_new_tokens", 128)  # SamplingParams.max_new_tokens = 128
        if max_new is None:
            max_new = self.options.context_length - prompt_len - 1
        return sampling_from(params, max_new, params.get("sampling_seed"))

    def _length_problem(self, prompt_len: int, params: dict[str, Any]) -> str | None:
        limit = self.options.context_length
        if prompt_len >= limit:
            return f"The input ({prompt_len} tokens) is longer than the model's context length ({limit} tokens)."  # noqa: E501
        max_new = params.get("max_new_tokens", 128)
        if not isinstance(max_new, int | None) or (max_new is not None and max_new < 0):
            return f"max_new_tokens must be at least 0, got {max_new}."
        if max_new is not None and max_new + prompt_len >= limit:
            return (
                f"Requested token count exceeds the model's maximum context length of {limit} "
                f"tokens. You requested a total of {max_new + prompt_len} tokens: {prompt_len} "
                f"tokens from the input messages and {max_new} tokens for the completion."
            )
        return None

    def _meta_info(
        self,
        rid: str,
        prompt_len: int,
        output: GenerationResult,
        labels: list[str],
        finish: dict[str, Any] | None,
        body: Any,
    ) -> dict[str, Any]:
        """``meta_info`` for ``output`` (all of it, or a stream's new tokens), whose whole
        output so far was sampled by weights ``labels``."""
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(labels),
            "cached_tokens": 0,
        }
        aborted = finish is not None and finish["type"] == "abort"
        if body.get("return_logprob") and not (aborted and not self.version.at_least(0, 5, 6)):
            temperature = float((body.get("sampling_params") or {}).get("temperature", 1.0))
            scale = self._logprob_scale(temperature)
            pairs = zip(output.logprobs, output.output_ids, strict=True)
            meta["output_token_logprobs"] = [[lp * scale, t, None] for lp, t in pairs]
            top = int(body.get("top_logprobs_num") or 0)
            if top:  # made-up alternatives: the sampled token first, then lesser ones
                meta["output_top_logprobs"] = [
                    [[lp * scale - k, t + k, None] for k in range(top)]
                    for lp, t in zip(output.logprobs, output.output_ids, strict=True)
                ]
        meta["weight_version"] = self.sim.label
        if self.version.latest:  # utils/weight_versions.py: newest only
            meta["weight_versions"] = _spans(labels, self.sim.label)
            meta["weight_version"] = meta["weight_versions"][-1]["version"]
        return meta

    def _stream(self, body: dict[str, Any]) -> Response:
        """A streamed ``/generate``: checks that answer before the stream are inside it."""
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or not input_ids:
            return _error("input_ids must be a non-empty list")
        params = dict(body.get("sampling_params") or {})
        if "sampling_seed" in params and not self.version.at_least(0, 5, 3):
            # The TypeError escapes stream_results (it catches ValueError): headers, then a cut.
            return EventStreamResponse(_no_events(), cut=True)
        problem = self._length_problem(len(input_ids), params)
        if problem is not None:  # stream_results: a ValueError is an error event, then [DONE]
            return EventStreamResponse(closing_events(sse_event({"error": {"message": problem}})))
        rid = body.get("rid") or uuid.uuid4().hex
        sampling = self._sampling(params, len(input_ids))
        fault = self.sim.next_fault()
        generation = StreamedGeneration(self.sim, rid, input_ids, sampling, fault)
        events = self._stream_events(generation, len(input_ids), body, fault)
        return EventStreamResponse(events, cut=fault == "drop")

    async def _stream_events(
        self, generation: StreamedGeneration, prompt_len: int, body: Any, fault: Fault
    ) -> AsyncIterator[bytes]:
        try:
            async for step in generation.steps(self.options.stream_interval):
                yield sse_event(self._stream_out(generation, step, prompt_len, body, fault))
                if fault == "drop":
                    return
            yield DONE_EVENT
        finally:
            if not generation.task.done():
                self._abort_later(generation)

    def _stream_out(
        self,
        generation: StreamedGeneration,
        step: StreamStep,
        prompt_len: int,
        body: Any,
        fault: Fault,
    ) -> dict[str, Any]:
        """One event: the new tokens (incremental) or the whole output so far (default)."""
        if self.options.incremental_streaming_output:
            output = GenerationResult(step.ids, step.logprobs, "stop")
        else:
            output = GenerationResult(generation.ids, generation.logprobs, "stop")
        finish = None
        if step.result is not None:
            whole = GenerationResult(generation.ids, generation.logprobs, step.result.finish_reason)
            finish = _finish(whole)
            if fault == "5xx":  # a scheduler error: an abort carrying its status
                finish = {"type": "abort", "message": "simulated overload", "status_code": 503}
        labels = [self.sim.labels[v] for v in generation.versions]
        meta = self._meta_info(generation.rid, prompt_len, output, labels, finish, body)
        return {"text": "", "output_ids": output.output_ids, "meta_info": meta}

    def _abort_later(self, generation: StreamedGeneration) -> None:
        """``create_abort_task``: a disconnected stream's request is aborted 2 s later."""

        async def abort() -> None:
            done, _ = await asyncio.wait({generation.task}, timeout=self.options.disconnect_abort_s)
            if not done:
                await self.sim.stop(generation.rid)
                await asyncio.wait({generation.task})

        orphan = asyncio.ensure_future(abort())
        self.orphans.add(orphan)
        orphan.add_done_callback(self.orphans.discard)

    def _logprob_scale(self, temperature: float) -> float:
        raw = self.options.original_logprobs or temperature < SAMPLING_EPS or temperature == 1.0
        return 1.0 if raw else 1.0 / temperature

    async def abort_request(self, request: Request) -> Response:
        body = orjson.loads(await request.body() or b"{}")
        rid, abort_all = str(body.get("rid") or ""), bool(body.get("abort_all"))
        state = self.sim.state
        if rid in state.generations:
            state.aborted.append(rid)  # for tests: the client asked, whatever it ended
        running = sorted(state.in_flight)
        # tokenizer_manager.abort_request: an unknown rid is ignored; the scheduler then aborts
        # every request whose rid starts with it.
        if abort_all or (rid and rid in running):
            for other in running:
                if abort_all or other.startswith(rid):
                    await self.sim.stop(other)
        return Response(status_code=200)

    async def pause_generation(self, request: Request) -> Response:
        mode = "abort"
        if self.version.at_least(0, 5, 6):
            mode = (orjson.loads(await request.body() or b"{}") or {}).get("mode", "abort")
            if mode not in _PAUSE_MODES:
                return _error(f"Invalid mode: {mode!r}. Expected one of {list(_PAUSE_MODES)}.")
        self.in_place_frozen = mode == "in_place" and bool(self.sim.state.in_flight)
        await self.sim.pause("abort" if mode == "abort" else "keep")
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        self.in_place_frozen = False
        await self.sim.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights(self, request: Request) -> Response:
        body = orjson.loads(await request.body() or b"{}")
        path = body.get("model_path")
        if not isinstance(path, str):
            return _error("model_path is required")
        if body.get("flush_cache", True) and self.in_place_frozen:
            # scheduler: assert flush_cache_success, "Cache flush failed after updating weights"
            return PlainTextResponse("Internal Server Error", status_code=500)
        label = body.get("weight_version")
        try:
            await self.sim.load_weights(path, None if label is None else str(label))
        except FileNotFoundError as exc:
            message = f"Failed to get weights iterator: {exc}."
            content = {"success": False, "message": message, "num_paused_requests": 0}
            return JSONResponse(content, status_code=400)
        message = "Succeeded to update model weights."
        if label is not None:
            message += f" Weight version updated to {label}."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    async def flush_cache(self, request: Request) -> Response:
        busy = self.in_place_frozen or (self.sim.paused is None and self.sim.state.in_flight)
        return PlainTextResponse(_FLUSHED, status_code=400 if busy else 200)

    async def health(self, request: Request) -> Response:
        """``health_generate``: 200 once an output arrives (checked each ``poll``), 503 after
        ``timeout`` without one; nothing comes out while paused."""
        deadline = time.monotonic() + self.options.health_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(self.options.health_poll_s, left))
            if self.sim.paused is None:
                return Response(status_code=200)
        return Response(status_code=503)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": "sim",
                "tokenizer_path": "sim",
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.sim.label,
            }
        )

    async def server_info(self, request: Request) -> Response:
        # dataclasses.asdict(server_args) | scheduler_info | version; context_length is the
        # --context-length flag, None unless given.
        return JSONResponse(
            {
                "model_path": "sim",
                "context_length": None,
                "max_total_num_tokens": 1 << 20,
                "max_req_input_len": self.options.context_length - 1,
                "weight_version": self.sim.label,
                "version": self.options.version,
            }
        )

    async def models(self, request: Request) -> Response:
        card: dict[str, Any] = {"id": "sim", "object": "model", "root": "sim"}
        card["max_model_len"] = self.options.context_length
        return JSONResponse({"object": "list", "data": [card]})

    async def weight_version(self, request: Request) -> Response:
        return JSONResponse({"weight_version": self.sim.label})

    async def workers(self, request: Request) -> Response:
        listed = [{"url": url, "model_id": "sim"} for url in self.options.workers]
        return JSONResponse({"workers": listed, "total": len(listed)})

    async def list_workers(self, request: Request) -> Response:
        return JSONResponse({"urls": list(self.options.workers)})

    async def loads(self, request: Request) -> Response:
        return JSONResponse({"workers": [{"worker": u, "load": 0} for u in self.options.workers]})


def _finish(result: GenerationResult) -> dict[str, Any]:
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": result.output_ids[-1] if result.output_ids else None}
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.output_ids)}
    return {"type": "abort", "message": "Abort in waiting queue"}


def _spans(labels: list[str], current: str) -> list[dict[str, Any]]:
    """``compute_weight_version_spans``: half-open runs of one label over output positions; an
    empty output has one empty span of the current label."""
    spans: list[dict[str, Any]] = []
    for position, label in enumerate(labels):
        if spans and spans[-1]["version"] == label:
            spans[-1]["end"] = position + 1
        else:
            spans.append({"version": label, "start": position, "end": position + 1})
    return spans or [{"version": current, "start": 0, "end": 0}]


def _error(message: str) -> Response:
    """``_create_error_response``: 400 with ``{"error": {"message": ...}}``."""
    return JSONResponse({"error": {"message": message}}, status_code=400)


async def _no_events() -> AsyncIterator[bytes]:
    return
    yield


async def _ok(request: Request) -> Response:
    return Response(status_code=200)
