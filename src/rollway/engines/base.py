"""The engine seam: token ids in, token ids and logprobs out."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rollway.types import ChatGeneration, GenerationResult, SamplingParams


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
