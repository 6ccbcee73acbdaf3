"""The streaming seam every engine shares: a non-streaming engine streams as one chunk, and
chunks put back together are exactly one result."""

from __future__ import annotations

import asyncio

import pytest

from rollway.engines.streaming import collect, stream_generation
from rollway.errors import EngineError
from rollway.generation import GenerationChunk, GenerationResult, SamplingParams


class _WholeAnswer:
    async def generate(self, input_ids, sampling, request_id):
        return GenerationResult([5, 6, 7], [-0.5, -0.25, -0.125], "length", [3, 3, 4])

    async def abort(self, request_id):
        pass

    async def close(self):
        pass


class _BrokenStream(_WholeAnswer):
    async def generate_stream(self, input_ids, sampling, request_id):
        yield GenerationChunk([1], [-1.0])


def _chunks(engine) -> list[GenerationChunk]:
    async def run():
        return [c async for c in stream_generation(engine, [1, 2], SamplingParams(), "r")]

    return asyncio.run(run())


def test_an_engine_without_a_stream_gives_its_whole_answer_as_one_finishing_chunk():
    chunks = _chunks(_WholeAnswer())
    assert len(chunks) == 1
    assert chunks[0].finish_reason == "length"
    assert collect(chunks) == GenerationResult(
        [5, 6, 7], [-0.5, -0.25, -0.125], "length", [3, 3, 4]
    )


def test_a_stream_that_never_finishes_is_an_engine_error():
    with pytest.raises(EngineError, match="without a finish reason"):
        _chunks(_BrokenStream())


def test_collect_joins_chunks_in_order_and_checks_their_lengths():
    joined = collect([GenerationChunk([1, 2], [-1.0, -2.0]), GenerationChunk([3], [-3.0], "stop")])
    assert joined == GenerationResult([1, 2, 3], [-1.0, -2.0, -3.0], "stop")
    with pytest.raises(EngineError, match="2 logprobs for 1 tokens"):
        collect([GenerationChunk([1], [-1.0, -2.0], "stop")])
    with pytest.raises(EngineError, match="without a finish reason"):
        collect([GenerationChunk([1], [-1.0])])
    with pytest.raises(EngineError, match="1 policy versions for 2 tokens"):
        collect([GenerationChunk([1], [-1.0]), GenerationChunk([2], [-2.0], "stop", [1])])
