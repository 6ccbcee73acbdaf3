"""Streaming over any engine: ``stream_generation`` uses an engine's own stream when it has one
and otherwise hands out its whole answer as one chunk; ``collect`` puts chunks back together
into the ``GenerationResult`` the non-streamed path would have recorded."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Iterable

from rollway.engines.base import Engine, StreamingEngine
from rollway.errors import EngineError
from rollway.generation import PER_TOKEN_EXTRAS, GenerationChunk, GenerationResult, SamplingParams


async def stream_generation(
    engine: Engine, input_ids: list[int], sampling: SamplingParams, request_id: str
) -> AsyncGenerator[GenerationChunk, None]:
    """The engine's chunks for this request; exactly one of them (the last) has a finish
    reason. An engine's stream that ends without one is an ``EngineError``."""
    if not isinstance(engine, StreamingEngine):
        result = await engine.generate(input_ids, sampling, request_id)
        yield GenerationChunk(**{name: getattr(result, name) for name in _RESULT_FIELDS})
        return
    stream = engine.generate_stream(input_ids, sampling, request_id)
    try:
        async for chunk in stream:
            yield chunk
            if chunk.finish_reason is not None:
                return
    finally:
        await stream.aclose()
    raise EngineError(f"the engine's stream for {request_id} ended without a finish reason")


def collect(chunks: Iterable[GenerationChunk]) -> GenerationResult:
    """The chunks of one request as one result; the last chunk must have finished it."""
    parts = list(chunks)
    for chunk in parts:
        for name in ("logprobs", *PER_TOKEN_EXTRAS):
            values = getattr(chunk, name)
            if values is not None and len(values) != len(chunk.output_ids):
                raise EngineError(
                    f"a chunk has {len(values)} {name} for {len(chunk.output_ids)} tokens"
                )
    if not parts or parts[-1].finish_reason is None:
        raise EngineError("a stream ended without a finish reason")
    whole = GenerationChunk.join(parts)
    versions = [part.policy_versions for part in parts if part.policy_versions is not None]
    given = sum(map(len, versions))
    if versions and given != len(whole.output_ids):  # all chunks have versions or none do
        raise EngineError(
            f"the stream gave {given} policy versions for {len(whole.output_ids)} tokens"
        )
    return whole.result()


_RESULT_FIELDS = tuple(field.name for field in dataclasses.fields(GenerationResult))
