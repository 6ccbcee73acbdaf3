"""The behaviour policy's logprobs: at a temperature other than 1 a sampled token's logprob is
``log_softmax(logits / T)``'s, what a trainer recomputes at its sampling temperature; the
temperature-1 ones stand beside them, and under top-p/top-k the mass that was kept."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.streaming import collect
from rollway.generation import GenerationResult, SamplingParams
from tests.engines.embedded.test_embedded import prompt


def forward_logits(engine: EmbeddedEngine, input_ids: list[int], output_ids: list[int]):
    """The logits that predicted each output id, from one fresh forward pass."""
    ids = torch.tensor([input_ids + output_ids], device=engine.device)
    with torch.inference_mode():
        logits = engine.model(ids).logits[0].float()
    start = len(input_ids) - 1
    return logits[start : start + len(output_ids)]


def top_p_mass(probs: torch.Tensor, top_p: float) -> tuple[float, set[int]]:
    """The smallest set of most likely tokens holding ``top_p`` of the mass, and its mass."""
    values, order = torch.sort(probs, descending=True)
    count = int((torch.cumsum(values, 0) < top_p).sum().item()) + 1
    return float(values[:count].sum().item()), set(order[:count].tolist())


async def test_logprobs_at_temperature_07_are_the_sampling_distributions(
    engine: EmbeddedEngine,
) -> None:
    input_ids = prompt(engine, "Tell me a short story about a fox.")
    sampling = SamplingParams(temperature=0.7, max_tokens=16, seed=3)
    result = await engine.generate(input_ids, sampling, "t07")
    logits = forward_logits(engine, input_ids, result.output_ids)
    rows = range(len(result.output_ids))
    scaled = torch.log_softmax(logits / 0.7, dim=-1)
    raw = torch.log_softmax(logits, dim=-1)
    assert result.logprob_kind == "processed_logprobs"
    assert result.raw_logprobs is not None and result.kept_mass is None
    assert result.logprobs == pytest.approx(
        [scaled[i, t].item() for i, t in zip(rows, result.output_ids, strict=True)], abs=1e-3
    )
    assert result.raw_logprobs == pytest.approx(
        [raw[i, t].item() for i, t in zip(rows, result.output_ids, strict=True)], abs=1e-3
    )
    # The two kinds differ on a real model: mixing them up would be caught here.
    gaps = [abs(a - b) for a, b in zip(result.logprobs, result.raw_logprobs, strict=True)]
    assert max(gaps) > 1e-2


async def test_at_temperature_1_the_logprobs_are_raw_and_not_stored_twice(
    engine: EmbeddedEngine,
) -> None:
    input_ids = prompt(engine, "Hi")
    for temperature in (1.0, 0.0):
        result = await engine.generate(
            input_ids, SamplingParams(temperature=temperature, max_tokens=4, seed=1), "t1"
        )
        assert result.logprob_kind == "raw_logprobs"
        assert result.raw_logprobs is None and result.kept_mass is None


async def test_top_p_records_the_mass_that_was_kept_for_each_token(engine: EmbeddedEngine) -> None:
    input_ids = prompt(engine, "Name a colour.")
    sampling = SamplingParams(temperature=0.7, top_p=0.8, max_tokens=12, seed=5)
    result = await engine.generate(input_ids, sampling, "topp")
    assert result.kept_mass is not None and len(result.kept_mass) == len(result.output_ids)
    probs = torch.softmax(forward_logits(engine, input_ids, result.output_ids) / 0.7, dim=-1)
    for row, token in enumerate(result.output_ids):
        mass, kept = top_p_mass(probs[row], 0.8)
        assert token in kept  # sampled from the kept set only
        assert result.kept_mass[row] == pytest.approx(mass, abs=1e-4)
        assert 0.8 - 1e-4 <= result.kept_mass[row] <= 1.0


async def test_top_k_mass_is_the_k_most_likely_tokens_mass(engine: EmbeddedEngine) -> None:
    input_ids = prompt(engine, "Say something.")
    sampling = SamplingParams(temperature=1.0, top_k=5, max_tokens=8, seed=2)
    result = await engine.generate(input_ids, sampling, "topk")
    assert result.logprob_kind == "raw_logprobs" and result.kept_mass is not None
    probs = torch.softmax(forward_logits(engine, input_ids, result.output_ids), dim=-1)
    for row, token in enumerate(result.output_ids):
        top = torch.topk(probs[row], 5)
        assert token in top.indices.tolist()
        assert result.kept_mass[row] == pytest.approx(top.values.sum().item(), abs=1e-4)


async def test_a_streamed_turn_carries_the_same_logprobs_raw_logprobs_and_mass(
    engine: EmbeddedEngine,
) -> None:
    input_ids = prompt(engine, "Count to five.")
    sampling = SamplingParams(temperature=0.6, top_p=0.9, max_tokens=10, seed=11)
    plain = await engine.generate(input_ids, sampling, "plain")
    chunks = [c async for c in engine.generate_stream(input_ids, sampling, "streamed")]
    streamed = collect(chunks)
    assert isinstance(streamed, GenerationResult)
    assert streamed.output_ids == plain.output_ids
    assert streamed.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
    assert streamed.raw_logprobs == pytest.approx(plain.raw_logprobs, abs=1e-5)
    assert streamed.kept_mass == pytest.approx(plain.kept_mass, abs=1e-5)


async def test_rows_of_one_batch_at_different_temperatures_each_get_their_own_kind(
    engine: EmbeddedEngine,
) -> None:
    input_ids = prompt(engine, "Why is the sky blue?")
    settings = [SamplingParams(temperature=t, max_tokens=6, seed=4) for t in (0.5, 1.0, 1.5)]
    results = await asyncio.gather(
        *[engine.generate(input_ids, s, f"mix-{i}") for i, s in enumerate(settings)]
    )
    for sampling, result in zip(settings, results, strict=True):
        logits = forward_logits(engine, input_ids, result.output_ids)
        table = torch.log_softmax(logits / sampling.temperature, dim=-1)
        expected = [table[i, t].item() for i, t in enumerate(result.output_ids)]
        assert result.logprobs == pytest.approx(expected, abs=1e-3)
