"""SGLang's native API, as the server really answers (sgl-project/sglang: ``python/sglang/srt/
entrypoints/http_server.py``, ``managers/tokenizer_manager.py``, ``managers/io_struct.py``,
``sampling/sampling_params.py``, ``layers/sampler.py``, ``utils/weight_versions.py``).

- ``POST /generate`` with ``input_ids``, ``rid`` and ``return_logprob``; the sampled ids and
  logprobs come from ``meta_info.output_token_logprobs`` (``[logprob, id, text]`` per token).
- A token cap is always sent: SGLang generates 128 tokens when ``max_new_tokens`` is absent.
  With no ``max_tokens`` asked, the cap is the room the context leaves; the context length is
  the constructor's ``context_length``, else what the server reports (``max_model_len`` in
  ``GET /v1/models``; ``/get_server_info`` only echoes the ``--context-length`` flag), else
  unknown and the cap is ``default_max_tokens``. SGLang refuses ``input + max_new_tokens >=
  context length`` (400), so the room is ``context_length - len(input_ids) - 1``; an asked
  ``max_tokens`` beyond it is cut to it (the turn then ends ``length``).
- Logprob kind: SGLang returns ``log_softmax(logits / temperature)`` unless the server runs
  with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``; top-p and top-k do not reshape them (they apply to
  the sampling probabilities only) and a temperature below 1e-6 is greedy, sampled at 1. So a
  result is ``raw_logprobs`` at temperature 1 or 0, or when the engine is told the server
  returns original logprobs (``original_logprobs=True``), else ``processed_logprobs``.
- ``sampling_seed`` is sent only when a seed is asked. It makes sampling reproducible only on a
  server run with ``--enable-deterministic-inference`` (otherwise SGLang accepts and ignores
  it). SGLang before 0.5.3 fails any request carrying it with HTTP 500; against a server known
  to be older the engine raises an ``EngineError`` naming the field instead of sending it.
- Aborts: ``POST /abort_request`` by rid, answered 200 with an empty body. SGLang aborts every
  rid that *starts with* the one given (``scheduler.py``: ``req.rid.startswith(recv_req.rid)``),
  so aborting ``a-1`` would also end ``a-12`` and ``a-1.1``: the rid on the wire is the request
  id with ``~`` after it (``wire_rid``), a character rollway ids never hold. An aborted
  generation answers 200 with finish ``abort`` and its partial output; aborted before its first
  token, older servers send no logprobs at all: an empty ``abort`` result, not an error.
- Health: SGLang's ``/health`` generates a token, waits up to 20 s and fails while generation is
  paused; ``health()`` asks the cheap ``/get_model_info`` (``/model_info`` on servers that
  renamed it) with ``health_timeout_s``, so a paused or busy server is not ejected.
- Weight sync (``WeightSync``): ``pause("abort")`` is ``/pause_generation {"mode": "abort"}``
  (in-flight generations end ``abort``, the call returns when none runs); ``pause("keep")`` is
  mode ``retract`` (running requests go back to the queue and continue after
  ``/continue_generation``; their KV cache is recomputed with the new weights); SGLang has no
  draining pause, so ``pause("drain")`` holds this engine's new calls, waits for its running
  ones, then pauses with ``abort`` (which then ends only other clients' requests). Calls made
  while paused wait at the server. ``update_weights(path, version)`` is
  ``/update_weights_from_disk {"model_path", "weight_version": str(version)}``: the path is a
  checkpoint folder on the server's disk (in-memory weights go through SGLang's
  ``/update_weights_from_tensor`` or ``/update_weights_from_distributed``, which this engine does
  not drive: a state dict is a ``ConfigError``). SGLang flushes its prefix cache as part of the
  load, so no separate ``/flush_cache`` is sent. ``policy_versions`` come from the answer's
  per-token ``weight_versions`` spans (newest SGLang), else its one ``weight_version`` for every
  token (so a generation kept across an update is stamped with the newer one), parsed as ints
  (``default``, SGLang's label before any load, is 0); a label that is not a number gives the
  engine's own ``policy_version``. Pause modes need SGLang >= 0.5.6: older servers ignore the
  mode and abort, so ``pause("keep")`` against one is an ``EngineError``.
- Routers: sgl-router and sgl-model-gateway forward ``/generate`` but have no ``/abort_request``,
  pause or weight routes, and pick the worker themselves. ``probe()`` (run at first use) asks
  ``/abort_request`` with an id nothing runs under; a 404 is a ``ConfigError`` naming the
  workers to list in the spec. An error rather than a warning: behind a router a cancelled or
  timed-out turn keeps generating and no weight update reaches the workers.
- Streaming (``generate_stream``, ``StreamingEngine``): the same ``/generate`` with ``"stream":
  true``, server-sent events read by ``sse.EventStream`` and ``sglang_stream.
  SGLangStream`` (SGLang's default whole-output events and ``--incremental-streaming-output``
  alike; the latter costs the server and the client far less on long outputs). Closing a stream
  early aborts its request by rid at once: SGLang itself aborts a closed stream only 2 s later.
- A server started with ``--api-key`` wants ``Authorization: Bearer`` on every route but
  ``/health``: pass ``api_key`` (or a ``RemoteClient(bearer=...)``); a 401 at probe time is a
  ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from rollway.engines.base import PauseMode, WeightSource
from rollway.engines.remote.connection import Answer, RemoteClient, served_context_length, token_cap
from rollway.engines.remote.sglang_stream import SGLangStream
from rollway.engines.remote.sglang_wire import (
    SGLangServer,
    parse_generate_response,
    parse_version,
    token_versions,
    version_number,
    wire_rid,
)
from rollway.engines.remote.sse import EventStream
from rollway.errors import ConfigError, EngineConnectError, EngineError
from rollway.generation import GenerationChunk, GenerationResult, LogprobKind, SamplingParams

log = logging.getLogger(__name__)

#: SGLang releases that brought what this engine may use.
SEED_VERSION = (0, 5, 3)
PAUSE_MODES_VERSION = (0, 5, 6)
#: SGLang's ``_SAMPLING_EPS``: a lower temperature is greedy, sampled at temperature 1.
SAMPLING_EPS = 1e-6
_SERVER_MODE: dict[str, str] = {"abort": "abort", "drain": "abort", "keep": "retract"}
_KEY_HINT = "sglang://HOST:PORT?api_key=KEY or ROLLWAY_ENGINE_API_KEY"


class SGLangEngine:
    """An SGLang server's native API; follows ``WeightSync`` (see the module docstring)."""

    # Declared for the gateway (engines.base.ModelInfo): None, it does not know.
    model_name: str | None = None
    tokenizer: Any = None
    context_length: int | None

    pause_modes: frozenset[PauseMode] = frozenset({"abort", "drain", "keep"})

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        http: RemoteClient | None = None,
        api_key: str | None = None,
        context_length: int | None = None,
        default_max_tokens: int = 4096,
        original_logprobs: bool = False,
        health_timeout_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = http or RemoteClient(timeout_s=timeout_s, bearer=api_key)
        self.context_length = context_length
        self.default_max_tokens = default_max_tokens
        self.original_logprobs = original_logprobs
        self.health_timeout_s = health_timeout_s
        self.policy_version = 0
        self.server: SGLangServer | None = None
        self._probe_lock = asyncio.Lock()
        self._info_route = "/get_model_info"
        self._paused = False
        #: Closed while a drain waits for this engine's running calls; they are counted.
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._running = 0

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        await self._open.wait()
        self._enter()
        try:
            server = await self.probe("/generate")
            payload = self.generate_payload(input_ids, sampling, request_id, server)
            url = f"{self.base_url}/generate"
            try:
                body = await self.http.send(url, payload, lambda: self.abort(request_id))
            except EngineConnectError:
                raise
            except EngineError as exc:
                raise _explain(exc, sampling, server) from exc
        finally:
            self._leave()
        return parse_generate_response(
            body,
            policy_version=self.policy_version,
            logprob_kind=self.logprob_kind(sampling),
            top=sampling.top_logprobs,
        )

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncGenerator[GenerationChunk, None]:
        """``generate`` in pieces (``StreamingEngine``): ``/generate`` with ``"stream": true``,
        read by ``SGLangStream`` whichever way the server streams. Closing it early aborts the
        request at once (SGLang itself aborts a closed stream's request 2 s later)."""
        await self._open.wait()
        self._enter()
        finished = False
        server: SGLangServer | None = None
        reader = SGLangStream(sampling.top_logprobs)
        kind = self.logprob_kind(sampling)
        events: AsyncGenerator[Any, None] | None = None
        try:
            server = await self.probe("/generate")
            payload = self.generate_payload(input_ids, sampling, request_id, server, stream=True)
            url = f"{self.base_url}/generate"
            last = None
            events = EventStream(self.http, url, payload, lambda: self.abort(request_id)).events()
            async for event in events:
                try:
                    new = reader.read(event)
                except EngineError:  # it may still run: a garbled event is no finish
                    await self.abort(request_id)
                    raise
                length = new.start + len(new.ids)
                versions = token_versions(new.meta, length, self.policy_version, new.start)
                chunk = GenerationChunk(
                    new.ids,
                    new.logprobs,
                    new.finish_reason,
                    versions,
                    kind,
                    top_ids=new.top_ids,
                    top_logprobs=new.top_logprobs,
                )
                if last is not None:
                    continue  # nothing but [DONE] follows the finish: read it, reuse the line
                if chunk.finish_reason is not None:
                    last = chunk
                elif chunk.output_ids:
                    yield chunk
            if last is None:
                raise EngineError(f"SGLang's stream for {request_id} ended without a finish")
            finished = True
            yield last
        except GeneratorExit:
            if not finished:
                await self.abort(request_id)
            raise
        except EngineConnectError:
            raise
        except EngineError as exc:
            if server is not None and sampling.seed is not None and not reader.seen:
                raise _explain_stream(exc, server) from exc
            raise
        finally:
            self._leave()
            if events is not None:
                await events.aclose()

    def generate_payload(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        server: SGLangServer,
        *,
        stream: bool = False,
    ) -> dict[str, Any]:
        """The ``/generate`` body; ``EngineError`` for a seed the server does not know."""
        if sampling.seed is not None and server.older_than(SEED_VERSION):
            raise EngineError(
                f"{self.base_url} runs SGLang {server.version_text}, which does not know "
                "sampling_params.sampling_seed (SGLang >= 0.5.3): drop the seed or "
                "upgrade the server"
            )
        return {
            "input_ids": input_ids,
            "rid": wire_rid(request_id),
            "sampling_params": self.sampling_params(sampling, len(input_ids)),
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": stream,
            **({"top_logprobs_num": sampling.top_logprobs} if sampling.top_logprobs else {}),
        }

    def sampling_params(self, sampling: SamplingParams, prompt_len: int) -> dict[str, Any]:
        context = self.server.context_length if self.server else self.context_length
        # SGLang refuses input + max_new_tokens >= context length: one token less fits.
        usable = None if context is None else context - 1
        params: dict[str, Any] = {
            "max_new_tokens": token_cap(
                sampling.max_tokens, prompt_len, usable, self.default_max_tokens
            ),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop": list(sampling.stop),
            "stop_token_ids": list(sampling.stop_token_ids),
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return params

    def logprob_kind(self, sampling: SamplingParams) -> LogprobKind:
        temperature = sampling.temperature
        raw = self.original_logprobs or temperature == 1.0 or temperature < SAMPLING_EPS
        return "raw_logprobs" if raw else "processed_logprobs"

    async def abort(self, request_id: str) -> None:
        rid = wire_rid(request_id)
        await self.http.post_quietly(f"{self.base_url}/abort_request", {"rid": rid})

    async def health(self) -> bool:
        """Liveness from the cheap info route, within ``health_timeout_s``."""
        for route in dict.fromkeys((self._info_route, "/get_model_info", "/model_info")):
            try:
                url = f"{self.base_url}{route}"
                answer = await self.http.call("GET", url, timeout_s=self.health_timeout_s)
            except EngineError:
                return False
            if answer.status != 404:
                self._info_route = route
                if answer.ok and isinstance(answer.body, dict):
                    self._note_served_version(answer.body.get("weight_version"))
                return answer.ok
        return False

    def _note_served_version(self, label: Any) -> None:
        """A server that restarted serves its start-up weights: the version it reports is the
        truth (a routed fleet then takes it out and replays the last update on it)."""
        served = version_number(label, self.policy_version) if label is not None else None
        if served is not None and served != self.policy_version:
            log.warning(
                "%s serves weights version %d, not %d (restarted?)",
                self.base_url,
                served,
                self.policy_version,
            )
            self.policy_version = served

    async def probe(self, route: str = "") -> SGLangServer:
        """What the server is, learnt once (first use calls it): a ``ConfigError`` for an
        SGLang router or a refused key; the release and context length otherwise. A server
        that cannot be reached is an ``EngineConnectError`` naming ``route``, the call that
        needed it, not the probe's own (``/abort_request``, which reads as a failed abort)."""
        if self.server is None:
            async with self._probe_lock:
                if self.server is None:
                    try:
                        self.server = await self._probe()
                    except EngineConnectError as exc:
                        why = exc.__cause__ or exc
                        raise EngineConnectError(
                            f"cannot connect to {self.base_url}{route}: {why}"
                        ) from exc
        return self.server

    async def pause(self, mode: PauseMode = "abort") -> None:
        if mode not in self.pause_modes:
            raise ConfigError(f"unknown pause mode {mode!r}: abort, drain or keep", "mode")
        server = await self.probe("/pause_generation")
        if mode == "keep" and server.older_than(PAUSE_MODES_VERSION):
            raise EngineError(
                f"pause('keep') needs SGLang >= 0.5.6 (/pause_generation modes); "
                f"{self.base_url} runs SGLang {server.version_text}, which ignores the mode and "
                "aborts: pause with 'abort' or 'drain'"
            )
        if mode == "drain":
            self._open.clear()
        try:
            if mode == "drain":
                await self._idle.wait()
            body = {"mode": _SERVER_MODE[mode]}
            await self._control("/pause_generation", body, "pausing generation")
            self._paused = True
        finally:
            self._open.set()

    async def resume(self) -> None:
        await self._control("/continue_generation", {}, "continuing generation")
        self._paused = False

    async def update_weights(self, source: WeightSource, version: int) -> None:
        if isinstance(source, Mapping):
            raise ConfigError(
                "SGLangEngine.update_weights takes a checkpoint folder on the server (a path); "
                "SGLang loads in-memory weights through /update_weights_from_tensor or "
                "/update_weights_from_distributed, which rollway does not drive",
                "source",
            )
        if version <= self.policy_version:
            raise ConfigError(
                f"weights version {version} does not follow {self.policy_version}", "version"
            )
        path = os.fspath(source)
        paused = self._paused
        if not paused:
            await self.pause("drain")
        try:
            body = {"model_path": path, "weight_version": str(version)}
            answer = await self._control(
                "/update_weights_from_disk", body, f"loading weights from {path!r}", check=False
            )
            if not answer.ok or not (isinstance(answer.body, dict) and answer.body.get("success")):
                message = answer.body.get("message") if isinstance(answer.body, dict) else None
                raise EngineError(
                    f"{self.base_url} did not load weights from {path!r} (a folder on the "
                    f"server): HTTP {answer.status} {message or answer.text}"
                )
            self.policy_version = version
        finally:
            if not paused:
                await self.resume()

    async def adopt_weights(self, source: WeightSource, version: int) -> None:
        """The server holds ``source`` as ``version``, loaded by another client of it (a
        sibling gateway worker): take the version, asking the server nothing."""
        if version <= self.policy_version:
            raise ConfigError(
                f"weights version {version} does not follow {self.policy_version}", "version"
            )
        self.policy_version = version

    async def close(self) -> None:
        await self.http.close()

    async def _probe(self) -> SGLangServer:
        await self._refuse_router()
        info = await self._get_json("/get_server_info", "/server_info")
        text = info.get("version") if isinstance(info.get("version"), str) else None
        context = self.context_length or await served_context_length(self.http, self.base_url)
        if context is None and isinstance(info.get("context_length"), int):
            context = info["context_length"]
        return SGLangServer(parse_version(text), text or "unknown", context)

    async def _refuse_router(self) -> None:
        """``/abort_request`` for an id nothing runs under: a no-op on a server (unknown rids
        are ignored), a 404 on a router."""
        probe = {"rid": f"rollway-probe-{uuid.uuid4().hex}"}
        answer = await self.http.call("POST", f"{self.base_url}/abort_request", probe)
        if answer.status == 401:
            raise ConfigError(
                f"{self.base_url} refused the request without a valid API key (HTTP 401): a "
                f"server started with --api-key needs it: {_KEY_HINT}",
                "engine",
            )
        if answer.status == 404:
            workers = await self._router_workers()
            hosts = ",".join(w.removeprefix("http://") for w in workers) or "W1:PORT,W2:PORT"
            raise ConfigError(
                f"{self.base_url} is an SGLang router (sgl-router / sgl-model-gateway): it has "
                "no /abort_request, /pause_generation or weight routes, so a cancelled turn "
                "would keep running and no weight update would reach its workers. Name the "
                f"workers in the engine spec and rollway routes itself: sglang://{hosts}",
                "engine",
            )

    async def _router_workers(self) -> list[str]:
        listed = await self._get_json("/workers")
        workers = listed.get("workers")
        if isinstance(workers, list):
            return [str(w["url"]) for w in workers if isinstance(w, dict) and "url" in w]
        urls = (await self._get_json("/list_workers")).get("urls")
        return [str(u) for u in urls] if isinstance(urls, list) else []

    async def _get_json(self, *routes: str) -> dict[str, Any]:
        """The JSON object the first route that exists answers with; {} when none does."""
        for route in routes:
            answer = await self.http.call("GET", f"{self.base_url}{route}", timeout_s=10.0)
            if answer.status != 404:
                return answer.body if answer.ok and isinstance(answer.body, dict) else {}
        return {}

    async def _control(
        self, route: str, body: dict[str, Any], doing: str, *, check: bool = True
    ) -> Answer:
        answer = await self.http.call("POST", f"{self.base_url}{route}", body)
        if answer.status == 404:
            raise EngineError(
                f"{self.base_url} has no {route} ({doing}): this needs an SGLang server, not a "
                "router, of a release with weight sync (pause modes: SGLang >= 0.5.6)"
            )
        if answer.status == 401:
            raise EngineError(f"{self.base_url}{route} wants an API key (HTTP 401): {_KEY_HINT}")
        if check and not answer.ok:
            raise EngineError(
                f"{self.base_url}{route} failed ({doing}): HTTP {answer.status} {answer.text}"
            )
        return answer

    def _enter(self) -> None:
        self._running += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._running -= 1
        if not self._running:
            self._idle.set()


def _explain_stream(error: EngineError, server: SGLangServer) -> EngineError:
    """A stream carrying a seed that broke before its first token, on a server of unknown
    release: SGLang before 0.5.3 drops it (the ``TypeError`` escapes the stream)."""
    if server.version is not None:
        return error
    return EngineError(
        f"{error} (SGLang older than 0.5.3 drops every stream carrying "
        "sampling_params.sampling_seed; drop the seed or upgrade the server)"
    )


def _explain(error: EngineError, sampling: SamplingParams, server: SGLangServer) -> EngineError:
    """Name the likely cause of an opaque 500: a seed sent to a server of unknown release."""
    if sampling.seed is not None and server.version is None and "HTTP 500" in str(error):
        return EngineError(
            f"{error} (SGLang older than 0.5.3 fails every request carrying "
            "sampling_params.sampling_seed with HTTP 500; drop the seed or upgrade the server)"
        )
    return error
