from __future__ import annotations

import asyncio
import time

from rollway.engines.sim import SimConfig, SimEngine
from rollway.engines.streaming import collect
from rollway.generation import SamplingParams


async def test_same_prompt_gives_same_ids_and_wellformed_logprobs() -> None:
    engine = SimEngine(SimConfig(output_len=10))
    first = await engine.generate([5, 6, 7], SamplingParams(), "a")
    again = await engine.generate([5, 6, 7], SamplingParams(), "b")
    other = await engine.generate([5, 6, 8], SamplingParams(), "c")
    assert first.output_ids == again.output_ids != other.output_ids
    assert len(first.logprobs) == 10 and all(lp <= 0.0 for lp in first.logprobs)
    assert first.finish_reason == "stop" and first.output_ids[-1] == 2


async def test_max_tokens_below_output_len_finishes_with_length() -> None:
    result = await SimEngine(SimConfig(output_len=10)).generate(
        [1], SamplingParams(max_tokens=3), "x"
    )
    assert result.finish_reason == "length" and len(result.output_ids) == 3


async def test_abort_ends_a_waiting_request() -> None:
    engine = SimEngine(SimConfig(latency_s=60.0))
    task = asyncio.create_task(engine.generate([1], SamplingParams(), "slow"))
    await asyncio.sleep(0)  # let the task run up to its first wait
    assert "slow" in engine._running
    await engine.abort("slow")
    result = await task
    assert result.finish_reason == "abort" and result.output_ids == []


async def test_an_abort_reaches_a_generation_frozen_by_keep_after_its_latency() -> None:
    engine = SimEngine(SimConfig(latency_s=0.1))
    task = asyncio.create_task(engine.generate([1], SamplingParams(), "frozen"))
    await asyncio.sleep(0.02)
    await engine.pause("keep")
    await asyncio.sleep(0.2)  # its latency is over; it waits for resume
    await engine.abort("frozen")
    result = await asyncio.wait_for(task, 2)
    assert result.finish_reason == "abort" and result.output_ids == []


async def _streamed(engine: SimEngine, sampling: SamplingParams, request_id: str) -> list:
    return [chunk async for chunk in engine.generate_stream([5, 6, 7], sampling, request_id)]


async def test_the_stream_gives_the_tokens_of_generate_one_chunk_each() -> None:
    engine = SimEngine(SimConfig(output_len=6))
    for sampling in (SamplingParams(), SamplingParams(max_tokens=4, seed=3)):
        whole = await engine.generate([5, 6, 7], sampling, "whole")
        chunks = await _streamed(engine, sampling, "streamed")
        assert collect(chunks) == whole
        assert [len(c.output_ids) for c in chunks] == [1] * len(whole.output_ids)
        assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)


async def test_the_stream_is_paced_latency_first_then_per_token() -> None:
    engine = SimEngine(SimConfig(latency_s=0.1, per_token_s=0.02, output_len=10))
    started, arrivals = time.monotonic(), []
    async for _ in engine.generate_stream([1], SamplingParams(), "paced"):
        arrivals.append(time.monotonic() - started)
    assert 0.1 <= arrivals[0] < arrivals[-1]
    assert arrivals[-1] >= 0.1 + 0.02 * 10
    assert arrivals[-1] - arrivals[0] >= 0.02 * 9


async def test_an_abort_ends_the_stream_after_the_tokens_already_given() -> None:
    engine = SimEngine(SimConfig(per_token_s=0.05, output_len=50))
    stream = engine.generate_stream([1], SamplingParams(), "cut")
    chunks = [await anext(stream), await anext(stream)]
    await engine.abort("cut")
    chunks += [chunk async for chunk in stream]
    assert chunks[-1].finish_reason == "abort" and chunks[-1].output_ids == []
    assert len(collect(chunks).output_ids) == 2 and engine._idle.is_set()


async def test_closing_the_stream_early_frees_the_request() -> None:
    engine = SimEngine(SimConfig(per_token_s=0.05, output_len=50))
    stream = engine.generate_stream([1], SamplingParams(), "left")
    await anext(stream)
    assert "left" in engine._running
    await stream.aclose()
    assert "left" not in engine._running and engine._idle.is_set()


async def test_a_keep_pause_holds_the_stream_and_stamps_later_tokens_with_the_new_version() -> None:
    engine = SimEngine(SimConfig(per_token_s=0.02, output_len=8))
    stream = engine.generate_stream([1], SamplingParams(), "kept")
    first = await anext(stream)
    await engine.pause("keep")
    await engine.update_weights("ckpt", 1)
    rest = asyncio.create_task(_drain(stream))
    await asyncio.sleep(0.1)
    assert not rest.done()  # it waits for resume
    await engine.resume()
    versions = [v for c in [first, *await rest] for v in c.policy_versions or []]
    assert versions[0] == 0 and versions[-1] == 1 and len(versions) == 8


async def _drain(stream) -> list:
    return [chunk async for chunk in stream]
