from __future__ import annotations

import asyncio

from rollway.engines.sim import SimConfig, SimEngine
from rollway.types import SamplingParams


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
