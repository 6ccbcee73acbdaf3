"""vLLM's OpenAI-compatible server: token ids in and out, and its weight-sync routes.

Generation is ``POST /v1/completions`` with the prompt as token ids, ``request_id``,
``return_token_ids`` (vLLM >= 0.10.2; older servers ignore the field and answer without ids),
``logprobs: 0`` (the sampled token's logprob) and always an explicit ``max_tokens``: vLLM samples
16 tokens when it is missing or null. vLLM aborts a request when its client disconnects, so
``abort`` drops the HTTP call.

``generate_stream`` streams the same request (``"stream": true``): ``vllm_stream`` reads its
delta chunks; errors met mid-stream (a finish ``error``, a refusal while paused) come as error
events in the 200 answer; ``abort`` drops the stream's connection too.

Weight sync uses development routes (the server must run with ``VLLM_SERVER_DEV_MODE=1``, else
they answer 404) of vLLM >= 0.16.0: ``POST /pause?mode=abort|wait|keep``, ``POST /resume``, new
weights by ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path":
DIR}}`` (DIR is a checkpoint folder as the server sees it), then ``POST /reset_prefix_cache``.
vLLM >= 0.33.0 also labels the weights (``POST /update_weight_version``) and says which label
sampled each output token (``return_weight_versions``); with older servers the engine stamps a
completion with the version that was sampling when it arrived.

Read from vLLM's source (PyPI sdists): 0.33.0 ``entrypoints/openai/completion/protocol.py``
(``max_tokens = 16``, ``normalize_null_max_tokens``, ``return_weight_versions``),
``entrypoints/rl/online/api_router.py`` (``/pause``, ``/resume``, ``/update_weight_version``),
``entrypoints/launchers/api_server/routers.py`` (dev routes only with ``VLLM_SERVER_DEV_MODE``),
``v1/engine/core.py`` (``_reject_add_while_paused``: HTTP 503 while an abort/wait pause lasts),
``v1/worker/gpu_model_runner.py`` (``reload_weights(weights_path=...)``, also in 0.16.0 but not
0.15.1), ``entrypoints/serve/instrumentator/health.py``; 0.10.1.1/0.10.2 ``protocol.py``
(``return_token_ids`` first in 0.10.2); 0.12.0 ``openai/api_server.py`` and 0.13.0-0.15.1
``serve/rlhf/api_router.py`` (``/pause`` took only ``wait_for_inflight_requests``, so ``mode``
would be ignored); 0.32.0 ``v1/engine/core.py`` (paused servers queue new requests).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from rollway.engines.base import PauseMode, WeightSource
from rollway.engines.remote.connection import DisconnectAbort, RemoteClient
from rollway.engines.remote.pause_gate import PauseGate
from rollway.engines.remote.sse import EventStream, StreamCuts
from rollway.engines.remote.vllm_stream import CompletionDelta, CompletionStream
from rollway.engines.remote.vllm_weights import ServedWeights, VLLMControl
from rollway.engines.remote.vllm_wire import (
    PAUSED_REFUSAL,
    VLLM_PAUSE_MODES,
    WEIGHT_LABELS_SINCE,
    WEIGHT_SYNC_SINCE,
    VLLMServer,
    finish_of,
    logprob_kind_of,
    max_model_len_of,
    named,
    no_token_ids,
    parse_completion,
    pause_modes_of,
    root_of,
    versions_of,
    vllm_payload,
)
from rollway.errors import ConfigError, EngineConnectError, EngineError
from rollway.generation import GenerationChunk, GenerationResult, SamplingParams

log = logging.getLogger(__name__)

_clock = time.monotonic  # a module name, so that a test can move it on


class VLLMEngine:
    """A vLLM server, token ids in and out, with the ``WeightSync`` seam.

    ``context_length`` caps every request at the room the prompt leaves (default: the server's
    ``max_model_len``); ``default_max_tokens`` is the cap when neither is known. ``logprobs_mode``
    is the server's ``--logprobs-mode`` (vLLM's default ``raw_logprobs``; ``processed_logprobs``
    is after temperature/top-p/top-k); it becomes each result's ``logprob_kind``.
    ``pause_modes`` is abort and drain until the server is known (``await server()``), then
    exactly what it supports: none before 0.16, keep from 0.33 (whose labels tell a frozen
    request's tokens apart). Generate calls made while paused wait for ``resume``.

    What the server said of itself is asked again after ``SERVER_INFO_TTL_S`` and after a
    failed request (a server restarted with another ``--max-model-len``). Once weights were
    pushed, each request first asks ``/weight_info`` (one call shared by concurrent requests):
    a server that restarted serves its start-up weights (label ``default``) and is given the
    last update again before the request goes, so no token is stamped with weights that did
    not sample it. Before any push, the first request asks once: a server holding weights an
    earlier client pushed (a label other than ``default``) is refused, naming the fix, since
    version 0 means the start-up weights.
    """

    #: How long the server's version and context length are trusted without asking again.
    SERVER_INFO_TTL_S = 10.0

    # Declared for the gateway (engines.base.ModelInfo): None, it does not know.
    model_name: str | None = None
    tokenizer: Any = None
    context_length: int | None

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        timeout_s: float = 600.0,
        http: RemoteClient | None = None,
        context_length: int | None = None,
        default_max_tokens: int = 4096,
        logprobs_mode: str = "raw_logprobs",
        health_timeout_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.http = http or RemoteClient(timeout_s=timeout_s)
        self._control = VLLMControl(self.base_url, self.http, health_timeout_s)
        self._weights = ServedWeights(self._control)
        self.context_length = context_length
        self._given_context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.logprob_kind = logprob_kind_of(logprobs_mode)
        self.health_timeout_s = health_timeout_s
        self.policy_version = 0
        self.pause_modes: frozenset[PauseMode] = frozenset({"abort", "drain"})
        self._calls = DisconnectAbort()
        self._streams = StreamCuts()
        self._gate = PauseGate()
        self._pauses = 0  # pauses begun so far: tells a refusal by our own pause
        self._sampling_version = 0  # the weights sampling now: during a pause, the old ones
        self._server: VLLMServer | None = None
        self._server_at = -float("inf")  # _clock() of the last answer to server()
        self._probing = asyncio.Lock()

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        server = await self._known_server()
        max_tokens = self._max_tokens(len(input_ids), sampling.max_tokens, server)
        if max_tokens <= 0:  # the prompt fills the context: nothing can be sampled
            return GenerationResult([], [], "length", [], self.logprob_kind)
        payload = vllm_payload(input_ids, sampling, request_id, self.model, max_tokens)
        if server.since(WEIGHT_LABELS_SINCE):
            payload["return_weight_versions"] = True
        url = f"{self.base_url}/v1/completions"
        while await self._gate.passed(request_id):
            await self._caught_up(server)
            pauses = self._pauses
            try:
                body = await self._calls.send(self.http, url, payload, request_id)
            except EngineError as exc:
                self._server_at = -float("inf")  # ask the server what it is again next time
                self._raise_unless_our_refusal(exc, pauses)
                continue  # our pause refused it before it ran: send it again after resume
            if body is None:
                break
            return parse_completion(
                body,
                server_version=server.version,
                logprob_kind=self.logprob_kind,
                stamp=self._sampling_version,
                top=sampling.top_logprobs,
            )
        return GenerationResult([], [], "abort", [], self.logprob_kind)

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncGenerator[GenerationChunk, None]:
        """``generate`` in pieces (``StreamingEngine``): the same request with ``"stream":
        true``, read by ``vllm_stream.CompletionStream``. Held by a pause and sent again after
        a refusal by it, as ``generate``. ``abort`` or closing it early drops the connection
        (vLLM's abort); an aborted stream ends with an empty ``abort`` chunk. Tokens are
        stamped with the weights sampling when they arrive; the last chunk's with the server's
        spans where it labels them (vLLM sends spans with the last chunk only)."""
        server = await self._known_server()
        max_tokens = self._max_tokens(len(input_ids), sampling.max_tokens, server)
        if max_tokens <= 0:  # the prompt fills the context: nothing can be sampled
            yield GenerationChunk([], [], "length", [], self.logprob_kind)
            return
        payload = vllm_payload(input_ids, sampling, request_id, self.model, max_tokens)
        payload["stream"] = True
        if server.since(WEIGHT_LABELS_SINCE):
            payload["return_weight_versions"] = True
        url = f"{self.base_url}/v1/completions"
        missing_ids = no_token_ids(server.version)
        while await self._gate.passed(request_id):
            await self._caught_up(server)
            pauses = self._pauses
            reader = CompletionStream(missing_ids, sampling.top_logprobs)
            try:
                async for chunk in self._stream_chunks(url, payload, request_id, reader):
                    yield chunk
                return
            except EngineError as exc:
                self._server_at = -float("inf")
                if reader.seen:
                    raise
                self._raise_unless_our_refusal(exc, pauses)
        yield GenerationChunk([], [], "abort", [], self.logprob_kind)

    def _raise_unless_our_refusal(self, error: EngineError, pauses: int) -> None:
        """Return when ``error`` is a refusal by a pause this engine began since ``pauses``
        (the request did not run: send it again after ``resume``); raise it otherwise."""
        if PAUSED_REFUSAL not in str(error):
            raise error
        if pauses == self._pauses and not self._gate.closed:
            raise EngineError(
                f"vLLM at {self.base_url} is paused by another client: resume it, or "
                "pause it through this engine"
            ) from error

    async def _stream_chunks(
        self, url: str, payload: dict[str, Any], request_id: str, reader: CompletionStream
    ) -> AsyncGenerator[GenerationChunk, None]:
        stream = EventStream(self.http, url, payload, _already_disconnected)
        events = stream.events()
        self._streams.add(request_id, stream)
        last: GenerationChunk | None = None
        try:
            async for event in events:
                delta = reader.read(event)
                if delta is None or last is not None:
                    continue  # a usage chunk, or [DONE] to come: read it, reuse the line
                chunk = self._chunk_of(delta)
                if chunk.finish_reason is not None:
                    last = chunk
                elif chunk.output_ids:
                    yield chunk
            if last is None and request_id not in self._streams.cut_ids and reader.seen:
                raise EngineError(f"vLLM's stream for {request_id} ended without a finish")
        finally:
            self._streams.remove(request_id)
            await events.aclose()
        # Cut by ``abort``, or an old vLLM's abort before any token (no last chunk is sent).
        yield last or GenerationChunk([], [], "abort", [], self.logprob_kind)

    def _chunk_of(self, delta: CompletionDelta) -> GenerationChunk:
        finish = None
        if delta.finish_reason is not None:
            finish = finish_of(delta.finish_reason)
        versions = [self._sampling_version] * len(delta.ids)
        if finish is not None and delta.spans is not None:
            whole = versions_of(delta.spans, delta.start + len(delta.ids))
            versions = whole[delta.start :]
        return GenerationChunk(
            delta.ids,
            delta.logprobs,
            finish,
            versions,
            self.logprob_kind,
            top_ids=delta.top_ids,
            top_logprobs=delta.top_logprobs,
        )

    async def abort(self, request_id: str) -> None:
        self._gate.release(request_id)
        self._calls.abort(request_id)
        self._streams.cut(request_id)

    async def health(self) -> bool:
        """vLLM's ``GET /health``: 200 while its engine process lives (it checks nothing else,
        so a paused or sleeping server is healthy), an error status once the engine died."""
        return await self.http.get_ok(f"{self.base_url}/health", self.health_timeout_s)

    async def close(self) -> None:
        self._gate.release_all()
        self._weights.close()
        await self.http.close()

    async def server(self) -> VLLMServer:
        """The server's version, context length and model folder, asked again once
        ``SERVER_INFO_TTL_S`` passed or a request failed; sets ``pause_modes`` and, unless
        given, ``context_length``. ``EngineConnectError`` when it does not answer."""
        if self._server is not None and not self._server_stale():
            return self._server
        async with self._probing:
            if self._server is None or self._server_stale():
                version = await self._control.get_json("/version")
                models = await self._control.get_json("/v1/models")
                self._server = VLLMServer(
                    version=str(version["version"]) if isinstance(version, dict) else None,
                    max_model_len=max_model_len_of(models, self.model),
                    root=root_of(models, self.model),
                )
                self._server_at = _clock()
                self.pause_modes = pause_modes_of(self._server)
                if self._given_context_length is None:
                    self.context_length = self._server.max_model_len
        return self._server

    def _server_stale(self) -> bool:
        return _clock() - self._server_at >= self.SERVER_INFO_TTL_S

    async def _known_server(self) -> VLLMServer:
        """``server()``, or what was last known (else nothing) when it does not answer: the
        request then fails, or succeeds, under the usual connection rules."""
        try:
            return await self.server()
        except EngineConnectError:
            return self._server or VLLMServer()

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self._check_weight_sync()
        if mode not in self.pause_modes:
            raise ConfigError(self._unsupported(mode), "mode")
        was_open = not self._gate.closed
        self._gate.close()
        self._pauses += 1
        try:
            await self._control.post("/pause", params={"mode": VLLM_PAUSE_MODES[mode]})
        except BaseException:
            if was_open:
                self._gate.open()
            raise

    async def resume(self) -> None:
        # Before the server resumes: whatever it samples from now on is the new weights'.
        self._sampling_version = self.policy_version
        await self._control.post("/resume", repeatable=True)
        self._gate.open()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        """Load the checkpoint folder ``source`` (a path on the server) as ``version``. A
        folder that is missing, holds no weights or weights of other shapes than the served
        model's is refused first (``ConfigError``) where it can be seen: the server is on this
        machine, or the folder is. A failure leaves the version unchanged and the engine paused
        only if its caller paused it."""
        if version <= self.policy_version:
            raise ConfigError(
                f"weights version {version} does not follow {self.policy_version}", "version"
            )
        if isinstance(source, Mapping):
            raise ConfigError(
                "vLLM loads new weights from a checkpoint folder on its machine; "
                "pass the folder's path (in-memory weights need the embedded engine)",
                "source",
            )
        server = await self._check_weight_sync()
        path = os.fspath(source)
        await self._weights.check_folder(path, server)
        pausing = not self._gate.closed
        if pausing:
            await self.pause("drain")
        try:
            async with self._weights.loading:
                await self._weights.load(path, version, server)
                self.policy_version = version
        except BaseException:
            if pausing:
                await self._resume_after_failure()
            raise
        if pausing:
            await self.resume()

    async def adopt_weights(self, source: WeightSource, version: int) -> None:
        """The server holds the folder ``source`` as ``version``, loaded by another client of
        it (a sibling gateway worker): take the version without asking the server anything.
        A restart of the server loads ``source`` again, as after ``update_weights``."""
        if version <= self.policy_version:
            raise ConfigError(
                f"weights version {version} does not follow {self.policy_version}", "version"
            )
        if isinstance(source, Mapping):
            raise ConfigError("vLLM's weights come from a checkpoint folder", "source")
        self._weights.last_load = os.fspath(source)
        self.policy_version = self._sampling_version = version

    async def _resume_after_failure(self) -> None:
        """Resume the pause a failed update made; the update's error is the one to raise."""
        try:
            await self.resume()
        except Exception as exc:
            log.error("vLLM at %s stays paused after a failed update: %s", self.base_url, exc)

    async def _caught_up(self, server: VLLMServer) -> None:
        """The server serves the weights this engine stamps (``ServedWeights.caught_up``)."""
        try:
            restarted = await self._weights.caught_up(server, self.policy_version)
        except EngineError:
            self._server_at = -float("inf")  # ask the server what it is again next time
            raise
        if restarted:  # maybe with other settings too
            self._server_at = -float("inf")

    def _max_tokens(self, prompt_len: int, wanted: int | None, server: VLLMServer) -> int:
        context = self.context_length or server.max_model_len
        if context is None:
            return self.default_max_tokens if wanted is None else wanted
        room = context - prompt_len
        return room if wanted is None else min(wanted, room)

    async def _check_weight_sync(self) -> VLLMServer:
        server = await self.server()
        if server.before(WEIGHT_SYNC_SINCE):
            raise ConfigError(
                f"weight sync needs vLLM >= {named(WEIGHT_SYNC_SINCE)} (pause modes, "
                f"reload_weights from a folder); {self.base_url} runs {server.version}",
                "engine",
            )
        return server

    def _unsupported(self, mode: str) -> str:
        if mode not in VLLM_PAUSE_MODES:
            return f"unknown pause mode {mode!r}: expected one of {', '.join(VLLM_PAUSE_MODES)}"
        version = self._server.version if self._server else None
        return (
            f"pause mode {mode!r} needs vLLM >= {named(WEIGHT_LABELS_SINCE)}, which says which "
            f"weights sampled each token of a frozen request; {self.base_url} runs {version}"
        )


async def _already_disconnected() -> None:
    """A failed stream's connection is already gone, which is vLLM's abort."""
