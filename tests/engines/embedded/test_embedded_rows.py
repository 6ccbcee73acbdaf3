"""One request's sampling never breaks another's: degenerate params sample like their limit,
and a row that fails anyway fails only its own request, however it was batched."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

import rollway.engines.embedded.batch_runner as batch_runner
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.embedded.sampling import choose_token
from rollway.errors import ConfigError, EngineError, InvalidFieldsError
from rollway.generation import GenerationResult, SamplingParams
from tests.engines.embedded.test_embedded import prompt, reference_logprobs

INNOCENT = SamplingParams(temperature=1.0, max_tokens=4, seed=11)


async def run_interleaved(
    engine: EmbeddedEngine, odd_ones: list[SamplingParams], name: str
) -> tuple[list[GenerationResult | BaseException], list[list[int]]]:
    """Innocent requests with each odd one between two of them, all queued at once. In at most
    two batches (asserted), every odd one shares a batch with an innocent neighbour."""
    texts = ["Name a fruit.", "What is the capital of France?", "Count to five.", "Hi", "Why?"]
    samplings = [INNOCENT]
    for odd in odd_ones:
        samplings += [odd, INNOCENT]
    prompts = [prompt(engine, texts[i % len(texts)]) for i in range(len(samplings))]
    before = engine.batches_run
    results = await asyncio.gather(
        *[
            engine.generate(p, s, f"{name}-{i}")
            for i, (p, s) in enumerate(zip(prompts, samplings, strict=True))
        ],
        return_exceptions=True,
    )
    assert engine.batches_run - before <= 2
    return results, prompts


def assert_exact(engine: EmbeddedEngine, input_ids: list[int], result: object) -> None:
    assert isinstance(result, GenerationResult), result
    assert len(result.output_ids) > 0
    expected = reference_logprobs(engine, input_ids, result.output_ids)
    assert result.logprobs == pytest.approx(expected, abs=1e-3)


async def test_vanishing_top_p_and_temperature_sample_greedily_beside_exact_neighbours(
    engine: EmbeddedEngine,
) -> None:
    hostile = [
        SamplingParams(top_p=1e-300, max_tokens=4, seed=1),
        SamplingParams(temperature=1e-300, max_tokens=4, seed=2),
    ]
    results, prompts = await run_interleaved(engine, hostile, "hostile")
    for input_ids, result in zip(prompts, results, strict=True):
        assert_exact(engine, input_ids, result)
    for index in (1, 3):  # the hostile rows: like temperature 0
        greedy = await engine.generate(
            prompts[index], SamplingParams(temperature=0, max_tokens=4), f"greedy-{index}"
        )
        assert results[index].output_ids == greedy.output_ids  # type: ignore[union-attr]


async def test_a_row_whose_sampling_fails_fails_only_its_own_request(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    doomed = SamplingParams(temperature=1.0, max_tokens=4, seed=666)

    def failing_for_the_doomed_row(
        logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator
    ) -> int:
        if sampling.seed == doomed.seed:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return choose_token(logits, sampling, generator)

    monkeypatch.setattr(batch_runner, "choose_token", failing_for_the_doomed_row)
    results, prompts = await run_interleaved(engine, [doomed], "doomed")
    assert isinstance(results[1], EngineError) and "probability tensor" in str(results[1])
    for index in (0, 2):
        assert_exact(engine, prompts[index], results[index])
    assert not engine._active


def test_nan_logits_are_an_error_not_a_token() -> None:
    logits = torch.tensor([math.nan, 0.0, 1.0])
    for sampling in (SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=1)):
        with pytest.raises(EngineError, match="NaN"):
            choose_token(logits, sampling, torch.Generator().manual_seed(0))


async def test_input_that_fills_the_context_is_refused(engine: EmbeddedEngine) -> None:
    with pytest.raises(InvalidFieldsError, match=str(engine.context_length)):
        await engine.generate([1] * engine.context_length, SamplingParams(), "full")


async def test_a_capped_context_bounds_prompt_and_answer(engine: EmbeddedEngine) -> None:
    """``context_length`` (vLLM's --max-model-len): a prompt that fits the model but not the
    cap is refused, and an answer stops at the cap."""
    capped = EmbeddedEngine(engine.model, engine.tokenizer, device=engine.device, context_length=64)
    try:
        assert capped.context_length == 64
        with pytest.raises(InvalidFieldsError, match="64"):
            await capped.generate([1] * 64, SamplingParams(), "over")
        result = await capped.generate([1] * 60, SamplingParams(max_tokens=50), "near")
        assert len(result.output_ids) <= 4 and result.finish_reason in ("length", "stop")
    finally:
        await capped.close()
    with pytest.raises(ConfigError, match="past the model's context"):
        EmbeddedEngine(engine.model, engine.tokenizer, device=engine.device, context_length=10**6)
