"""The embedded engine's stream: tokens handed out as the batch samples them, exactly what
``generate`` returns, aborted when its reader stops reading."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rollway.engines.base import StreamingEngine
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.streaming import collect
from rollway.generation import GenerationChunk, SamplingParams
from tests.engines.embedded.test_embedded import prompt, reference_logprobs

ESSAY = "Write a very long essay about the sea."


@pytest.fixture
async def fresh(engine: EmbeddedEngine) -> AsyncIterator[EmbeddedEngine]:
    """An engine over the session's model without a prefix cache: two runs of one prompt do
    the very same arithmetic, so their logprobs match to the bit."""
    other = EmbeddedEngine(
        engine.model, engine.tokenizer, device=engine.device, prefix_cache_tokens=0
    )
    yield other
    await other.close()


async def stream(
    engine: EmbeddedEngine, ids: list[int], sampling: SamplingParams, request_id: str
) -> list[GenerationChunk]:
    return [chunk async for chunk in engine.generate_stream(ids, sampling, request_id)]


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0, max_tokens=20), SamplingParams(max_tokens=20, seed=31)],
    ids=["greedy", "seeded"],
)
async def test_the_chunks_joined_are_exactly_what_generate_returns(
    fresh: EmbeddedEngine, sampling: SamplingParams
) -> None:
    assert isinstance(fresh, StreamingEngine)
    ids = prompt(fresh, ESSAY)
    generated = await fresh.generate(ids, sampling, "plain")
    chunks = await stream(fresh, ids, sampling, "streamed")
    assert len(chunks) > 1
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert collect(chunks) == generated
    assert generated.finish_reason == "length" and len(generated.output_ids) == 20
    assert generated.policy_versions == [fresh.policy_version] * 20


async def test_tokens_arrive_while_the_answer_is_still_being_sampled(
    fresh: EmbeddedEngine,
) -> None:
    ids = prompt(fresh, ESSAY)
    sampling = SamplingParams(max_tokens=20, seed=32)
    in_flight: list[bool] = []  # per chunk: was the request still unanswered when it came?
    async for chunk in fresh.generate_stream(ids, sampling, "live"):
        in_flight.append("live" in fresh._active and chunk.finish_reason is None)
    assert len(in_flight) > 1
    assert in_flight[0]


async def test_closing_the_stream_after_its_first_chunk_aborts_only_that_request(
    fresh: EmbeddedEngine,
) -> None:
    ids = prompt(fresh, ESSAY)
    aborted = fresh.aborted_total
    neighbour = asyncio.create_task(fresh.generate(ids, SamplingParams(max_tokens=10), "n"))
    long = fresh.generate_stream(ids, SamplingParams(max_tokens=400), "closed-early")
    first = await anext(long)
    assert first.finish_reason is None and len(first.output_ids) >= 1
    await long.aclose()  # returns once the worker has answered it: its slot is free
    assert "closed-early" not in fresh._active
    assert fresh.aborted_total == aborted + 1
    result = await neighbour
    assert result.finish_reason == "length" and len(result.output_ids) == 10
    assert result.logprobs == pytest.approx(
        reference_logprobs(fresh, ids, result.output_ids), abs=1e-3
    )
    assert not fresh._active


async def test_cancelling_the_reader_or_aborting_the_id_ends_the_stream(
    fresh: EmbeddedEngine,
) -> None:
    ids = prompt(fresh, ESSAY)
    sampling = SamplingParams(max_tokens=400)
    got_one = asyncio.Event()

    async def read(request_id: str) -> list[GenerationChunk]:
        chunks = []
        async for chunk in fresh.generate_stream(ids, sampling, request_id):
            chunks.append(chunk)
            got_one.set()
        return chunks

    reader = asyncio.create_task(read("cancelled"))
    await got_one.wait()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert "cancelled" not in fresh._active

    got_one.clear()
    reader = asyncio.create_task(read("aborted"))
    await got_one.wait()
    await fresh.abort("aborted")
    chunks = await reader
    assert chunks[-1].finish_reason == "abort"
    assert 0 < len(collect(chunks).output_ids) < 400
    assert not fresh._active


async def test_concurrent_streams_and_generates_interleave(fresh: EmbeddedEngine) -> None:
    questions = [ESSAY, "Tell me about mountains, at length.", "Describe a long train journey."]
    prompts = [prompt(fresh, q) for q in questions]
    sampling = [SamplingParams(max_tokens=10, seed=40 + i) for i in range(len(prompts))]
    arrivals: list[str] = []  # the order in which streamed chunks and whole answers came

    async def streamed(i: int) -> list[GenerationChunk]:
        chunks = []
        async for chunk in fresh.generate_stream(prompts[i], sampling[i], f"s-{i}"):
            chunks.append(chunk)
            arrivals.append(f"chunk s-{i}")
        return chunks

    async def generated(i: int):
        result = await fresh.generate(prompts[i], sampling[i], f"g-{i}")
        arrivals.append(f"answer g-{i}")
        return result

    results = await asyncio.gather(
        *[streamed(i) for i in range(len(prompts))], *[generated(i) for i in range(len(prompts))]
    )
    streams, answers = results[: len(prompts)], results[len(prompts) :]
    for i, (chunks, answer) in enumerate(zip(streams, answers, strict=True)):
        joined = collect(chunks)
        assert len(chunks) > 1
        # Same prompt and seed in one batch: the same tokens, each scored as a fresh pass.
        assert joined.output_ids == answer.output_ids
        assert joined.finish_reason == answer.finish_reason
        expected = reference_logprobs(fresh, prompts[i], joined.output_ids)
        assert joined.logprobs == pytest.approx(expected, abs=1e-3)
    # Every stream had handed out tokens before the first whole answer came.
    first_answer = min(arrivals.index(f"answer g-{i}") for i in range(len(prompts)))
    assert {f"chunk s-{i}" for i in range(len(prompts))} <= set(arrivals[:first_answer])
    assert not fresh._active


async def test_a_kept_stream_carries_each_tokens_weights_version(fresh: EmbeddedEngine) -> None:
    ids = prompt(fresh, ESSAY)
    old = fresh.policy_version
    sampling = SamplingParams(max_tokens=10, seed=50)
    chunks = fresh.generate_stream(ids, sampling, "kept")
    received = [await anext(chunks)]
    await fresh.pause("keep")
    before = len(fresh._active["kept"].output_ids)  # sampled by the old weights
    # The model's own tensors under a new version: the weights the session shares stay.
    await fresh.update_weights(dict(fresh.model.state_dict()), old + 1)
    await fresh.resume()
    received += [chunk async for chunk in chunks]
    joined = collect(received)
    assert joined.finish_reason == "length" and len(joined.output_ids) == 10
    assert 0 < before < 10
    assert joined.policy_versions == [old] * before + [old + 1] * (10 - before)
