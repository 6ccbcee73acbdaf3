"""Streaming over any engine: ``stream_generation`` uses an engine's own stream when it has one
and otherwise hands out its whole answer as one chunk; ``collect`` puts chunks back together
into the ``GenerationResult`` the non-streamed path would have recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from rollway.engines.base import Engine, StreamingEngine
from rollway.errors import EngineError
from rollway.types import GenerationChunk, GenerationResult, SamplingParams


async def stream_generation(
    engine: Engine, input_ids: list[int], sampling: SamplingParams, request_id: str
) -> AsyncIterator[GenerationChunk]:
    """The engine's chunks for this request; exactly one of them (the last) has a finish
    reason. An engine's stream that ends without one is an ``EngineError``."""
    if not isinstance(engine, StreamingEngine):
        result = await engine.generate(input_ids, sampling, request_id)
        yield GenerationChunk(
            result.output_ids,
            result.logprobs,
            result.finish_reason,
            result.policy_versions,
            result.logprob_kind,
        )
        return
    stream = engine.generate_stream(input_ids, sampling, request_id)
    try:
        async for chunk in stream:
            yield chunk
            if chunk.finish_reason is not None:
                return
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    raise EngineError(f"the engine's stream for {request_id} ended without a finish reason")


def collect(chunks: Iterable[GenerationChunk]) -> GenerationResult:
    """The chunks of one request as one result; the last chunk must have finished it."""
    ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] | None = None
    finish = None
    kind = "raw_logprobs"
    for chunk in chunks:
        if len(chunk.logprobs) != len(chunk.output_ids):
            raise EngineError(
                f"a chunk has {len(chunk.logprobs)} logprobs for {len(chunk.output_ids)} tokens"
            )
        ids.extend(chunk.output_ids)
        logprobs.extend(chunk.logprobs)
        if chunk.policy_versions is not None:
            # All chunks of a request have versions or none do: a mix fails the check below.
            versions = versions if versions is not None else []
            versions.extend(chunk.policy_versions)
        finish = chunk.finish_reason or finish
        kind = chunk.logprob_kind
    if finish is None:
        raise EngineError("a stream ended without a finish reason")
    if versions is not None and len(versions) != len(ids):
        raise EngineError(f"the stream gave {len(versions)} policy versions for {len(ids)} tokens")
    return GenerationResult(ids, logprobs, finish, versions, kind)  # type: ignore[arg-type]
