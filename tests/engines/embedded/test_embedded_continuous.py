"""Continuous batching and the prefix cache: requests join and leave a running batch between
decode steps, a conversation's next turn reuses its previous turn's KV, and logprobs stay
those of a fresh forward pass of the whole sequence throughout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from transformers import MistralConfig, MistralForCausalLM

from rollway.engines.embedded import EmbeddedEngine
from rollway.errors import ConfigError
from rollway.generation import GenerationResult, SamplingParams
from tests.engines.embedded.test_embedded import next_turn, prompt, reference_logprobs
from tests.engines.embedded.test_embedded_weights import wait_for_tokens

LONG = SamplingParams(temperature=1.0, max_tokens=24, seed=21)
SHORT = SamplingParams(temperature=1.0, max_tokens=3, seed=22)


def assert_exact(engine: EmbeddedEngine, input_ids: list[int], result: GenerationResult) -> None:
    assert len(result.output_ids) > 0
    expected = reference_logprobs(engine, input_ids, result.output_ids)
    assert result.logprobs == pytest.approx(expected, abs=1e-3)


@pytest.fixture
async def small_engine(engine: EmbeddedEngine) -> AsyncIterator[EmbeddedEngine]:
    """A second engine over the session's model: two slots, a prefix cache of 64 tokens."""
    other = EmbeddedEngine(
        engine.model, engine.tokenizer, device=engine.device, max_batch_size=2,
        prefix_cache_tokens=64,
    )  # fmt: skip
    yield other
    await other.close()


async def test_a_request_joins_the_running_batch_without_waiting_for_it(
    engine: EmbeddedEngine,
) -> None:
    long_ids = prompt(engine, "Write a very long essay about the sea.")
    # A prompt longer than the running row (its prompt and a few tokens) when it joins: the
    # running row is padded on the left to merge.
    question = (
        "Name three colours of the rainbow, then explain in a few plain sentences why the sky "
        "looks blue on clear summer days and red at sunset."
    )
    short_ids = prompt(engine, question)
    assert len(short_ids) > len(long_ids) + 15
    running = asyncio.create_task(engine.generate(long_ids, LONG, "join-long"))
    await wait_for_tokens(engine, "join-long", 3)
    short = await engine.generate(short_ids, SHORT, "join-short")
    assert not running.done()  # it joined the running batch and left it first
    long = await running
    assert long.finish_reason == "length" and len(long.output_ids) == 24
    assert_exact(engine, short_ids, short)
    assert_exact(engine, long_ids, long)


async def test_a_finished_row_frees_its_slot_at_once(small_engine: EmbeddedEngine) -> None:
    ids = prompt(small_engine, "Write a very long essay about the sea.")
    # Two slots: the long and the first short request run, the second short one waits.
    running = asyncio.create_task(small_engine.generate(ids, LONG, "slot-long"))
    first = asyncio.create_task(small_engine.generate(ids, SHORT, "slot-short-1"))
    waiting = asyncio.create_task(small_engine.generate(ids, SHORT, "slot-short-2"))
    await asyncio.wait([first, waiting])
    assert not running.done()  # the second short one took the first one's slot
    for result in (first.result(), waiting.result(), await running):
        assert_exact(small_engine, ids, result)


async def test_a_running_requests_prompt_serves_a_request_admitted_later(
    engine: EmbeddedEngine,
) -> None:
    # A GRPO group whose members arrive apart: the first one's prompt KV serves the others.
    ids = prompt(engine, "Write a very long essay about the sea and its storms.")
    running = asyncio.create_task(engine.generate(ids, LONG, "group-first"))
    await wait_for_tokens(engine, "group-first", 1)
    saved = engine.prefix_tokens_saved
    later = await engine.generate(ids, SHORT, "group-later")
    assert engine.prefix_tokens_saved - saved == len(ids) - 1  # all but the last token
    assert_exact(engine, ids, later)
    assert_exact(engine, ids, await running)


async def test_the_next_turn_reuses_the_previous_turns_kv(engine: EmbeddedEngine) -> None:
    first_ids = prompt(engine, "Name a fruit that grows on trees in Brazil.")
    sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=31)
    first = await engine.generate(first_ids, sampling, "turn-1")
    second_ids = next_turn(engine, first_ids, first)
    saved, hits = engine.prefix_tokens_saved, engine.prefix_cache.hits
    second = await engine.generate(second_ids, sampling, "turn-2")
    # Turn 1 ran its prompt and all its tokens but the last sampled one.
    assert engine.prefix_tokens_saved - saved == len(first_ids) + len(first.output_ids) - 1
    assert engine.prefix_cache.hits == hits + 1
    assert_exact(engine, second_ids, second)


async def test_an_evicted_prefix_is_recomputed_exactly(small_engine: EmbeddedEngine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=32)
    mine = prompt(small_engine, "Tell me about the moon.")
    other = prompt(small_engine, "Tell me about volcanoes and their eruptions, please.")
    cache = small_engine.prefix_cache
    assert len(mine) + len(other) > cache.max_tokens  # the cache holds one of the two
    first = await small_engine.generate(mine, sampling, "evicted-1")
    await small_engine.generate(other, sampling, "evicting")
    assert len(cache) == 1 and cache.tokens <= cache.max_tokens
    second_ids = next_turn(small_engine, mine, first)
    saved = small_engine.prefix_tokens_saved
    second = await small_engine.generate(second_ids, sampling, "evicted-2")
    # Only the head the two prompts share (the chat template's system prompt) was reused.
    assert 0 < small_engine.prefix_tokens_saved - saved < len(mine)
    assert_exact(small_engine, second_ids, second)


async def test_groups_admitted_together_compute_each_shared_prefix_once(
    engine: EmbeddedEngine,
) -> None:
    system = "You are a terse assistant. You answer every question in one short sentence. " * 2

    def group_prompt(question: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        text = engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return engine.tokenizer.encode(text, add_special_tokens=False)

    # Each task differs over more than the 16 tokens that are worth a pass of their own.
    task_a = group_prompt("What do cats like to eat when they are hungry after a long day outside?")
    task_b = group_prompt("Why do birds sing so loudly in the early morning hours of a spring day?")
    shared = next(i for i, (a, b) in enumerate(zip(task_a, task_b, strict=False)) if a != b)
    prompts = [task_a, task_b, task_a, task_b]  # two GRPO groups of two
    sampling = SamplingParams(temperature=1.0, max_tokens=5, seed=33)
    saved = engine.prefix_tokens_saved
    await engine.pause("drain")  # queue all four, so that they are admitted together
    tasks = [
        asyncio.create_task(engine.generate(p, sampling, f"groups-{i}"))
        for i, p in enumerate(prompts)
    ]
    await asyncio.sleep(0)  # they reach the queue
    await engine.resume()
    results = await asyncio.gather(*tasks)
    # Each group's prompt ran once (but its last token); the second group reused the first's
    # system prompt: only what differs ran twice.
    assert engine.prefix_tokens_saved - saved >= len(task_a) - 1 + len(task_b) - 1 + shared
    for input_ids, result in zip(prompts, results, strict=True):
        assert_exact(engine, input_ids, result)


def test_a_model_with_sliding_window_attention_is_refused(engine: EmbeddedEngine) -> None:
    # Masked columns (padding, gaps before a reused prefix) would count in its window.
    config = MistralConfig(
        vocab_size=engine.vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=8,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="full-attention"):
        EmbeddedEngine(MistralForCausalLM(config), engine.tokenizer, device=engine.device)
