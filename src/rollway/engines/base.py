"""The engine seam: token ids in, token ids and logprobs out."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from rollway.generation import ChatGeneration, GenerationChunk, GenerationResult, SamplingParams

#: How ``pause`` treats generations in flight: ``abort`` ends them at once (finish ``abort``;
#: the gateway re-issues the turn after ``resume``), ``drain`` lets them finish, ``keep``
#: freezes them and continues them after ``resume`` (their later tokens carry the new version).
PauseMode = Literal["abort", "drain", "keep"]
#: New weights: a checkpoint folder (every engine; for a remote engine, a path on the server),
#: or an in-memory state dict (the embedded engine).
WeightSource = str | os.PathLike[str] | Mapping[str, Any]


@runtime_checkable
class Engine(Protocol):
    """A token-level generation backend.

    ``generate`` samples a completion for ``input_ids`` and returns the sampled ids, the
    logprob of each (log-softmax at temperature 1, fp32) and a finish reason: ``"stop"`` (an
    end-of-sequence token, a stop token id or a stop string), ``"length"`` (``max_tokens``) or
    ``"abort"``. ``request_id`` names the request for ``abort``, which stops it whether queued
    or running; aborting an unknown or finished id does nothing. ``close`` releases resources.
    """

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult: ...

    async def abort(self, request_id: str) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that hands out tokens as it samples them.

    ``generate_stream`` is ``generate`` in pieces: the same request (same ids, sampling and
    ``request_id``, abortable the same way) yields ``GenerationChunk``s of the tokens sampled
    since the last chunk, and its last chunk has the finish reason. Concatenated, the chunks
    are exactly what ``generate`` would have returned (same ids, logprobs, versions). Closing
    the iterator early aborts the request. An engine without it is streamed by
    ``engines.streaming.stream_generation`` as one chunk."""

    def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncGenerator[GenerationChunk, None]: ...


@runtime_checkable
class ChatEngine(Protocol):
    """A message-level backend (any OpenAI-compatible chat API): for evaluation with hosted
    models. It has no token ids, so the gateway records messages, usage and logprobs where
    given, and marks the trajectory ``has_token_ids: false``."""

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
        request_id: str,
    ) -> ChatGeneration: ...

    async def abort(self, request_id: str) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class WeightSync(Protocol):
    """An engine whose weights a training loop replaces between (or during) generations.

    ``policy_version`` is the version of the weights sampling now (0 before any update).
    ``pause(mode)`` returns once no forward pass of the old weights is running (see
    ``PauseMode``; ``pause_modes`` lists those this engine supports); ``generate`` calls made
    while paused wait for ``resume``. ``update_weights(source, version)`` loads new weights:
    while paused it only loads; otherwise it pauses (``drain``), loads and resumes. Versions
    must increase. Every result's ``policy_versions`` say which weights sampled each token.
    """

    policy_version: int
    pause_modes: frozenset[PauseMode]

    async def pause(self, mode: PauseMode = "abort") -> None: ...

    async def resume(self) -> None: ...

    async def update_weights(self, source: WeightSource, version: int) -> None: ...


@runtime_checkable
class SharedWeights(Protocol):
    """A ``WeightSync`` engine whose weights live in servers that other clients use too (a
    remote engine). Several gateways on one server (``rollway gateway --workers N``) have one
    of them load an update; the others ``adopt_weights``: take ``version`` as what the server
    serves (or will, once the loader resumes it), asking nothing of the server, so it loads each
    update once. Tokens received from then on are stamped ``version``."""

    async def adopt_weights(self, source: WeightSource, version: int) -> None: ...


@runtime_checkable
class ModelInfo(Protocol):
    """An engine that knows its model. Every built-in engine declares all three (None where it
    does not know): the gateway names the model, templates with the engine's own tokenizer and
    bounds prompts by the context; without them it loads the tokenizer from the model folder
    and lets the server enforce its own context. Read-only here: the gateway only reads them."""

    @property
    def model_name(self) -> str | None: ...
    @property
    def tokenizer(self) -> Any | None: ...
    @property
    def context_length(self) -> int | None: ...


@runtime_checkable
class HealthChecked(Protocol):
    """An engine that can say whether it serves (a router ejects endpoints that do not)."""

    async def health(self) -> bool: ...


@runtime_checkable
class ReportsStats(Protocol):
    """An engine with several endpoints: their states, for ``/metrics``."""

    def stats(self) -> dict[str, Any]: ...
