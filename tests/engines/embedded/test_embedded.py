from __future__ import annotations

import asyncio

import pytest
import torch

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.embedded.batch_runner import Request
from rollway.errors import InvalidFieldsError
from rollway.generation import GenerationResult, SamplingParams


def prompt(engine: EmbeddedEngine, text: str) -> list[int]:
    rendered = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return engine.tokenizer.encode(rendered, add_special_tokens=False)


def reference_logprobs(engine: EmbeddedEngine, input_ids: list[int], output_ids: list[int]):
    ids = torch.tensor([input_ids + output_ids], device=engine.device)
    with torch.inference_mode():
        logits = engine.model(ids).logits[0].float()
    table = torch.log_softmax(logits, dim=-1)
    start = len(input_ids) - 1
    return [table[start + i, t].item() for i, t in enumerate(output_ids)]


def next_turn(engine: EmbeddedEngine, input_ids: list[int], result: GenerationResult) -> list[int]:
    """The prompt of a conversation's next turn: this one's, its completion, a user message."""
    end = "" if result.output_ids[-1] in engine.eos_token_ids else "<|im_end|>"
    text = f"{end}\n<|im_start|>user\nAnd why is that?<|im_end|>\n<|im_start|>assistant\n"
    return input_ids + result.output_ids + engine.tokenizer.encode(text, add_special_tokens=False)


async def test_batched_logprobs_equal_a_fresh_forward_pass(engine: EmbeddedEngine) -> None:
    # Prompts of different lengths share one left-padded batch.
    prompts = [prompt(engine, q) for q in ("Hi", "Name three colors of the rainbow, please.")]
    sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
    results = await asyncio.gather(
        *[engine.generate(p, sampling, f"lp-{i}") for i, p in enumerate(prompts)]
    )
    for input_ids, result in zip(prompts, results, strict=True):
        assert len(result.output_ids) == len(result.logprobs) > 0
        expected = reference_logprobs(engine, input_ids, result.output_ids)
        assert result.logprobs == pytest.approx(expected, abs=1e-3)


async def test_concurrent_requests_share_batches(engine: EmbeddedEngine) -> None:
    before = engine.batches_run
    sampling = SamplingParams(max_tokens=4, seed=1)
    ids = prompt(engine, "Count to three.")
    results = await asyncio.gather(*[engine.generate(ids, sampling, f"b-{i}") for i in range(8)])
    assert all(len(r.output_ids) == 4 and r.finish_reason == "length" for r in results)
    assert engine.batches_run - before <= 2


async def test_seeded_request_samples_the_same_tokens_alone_and_in_a_batch(
    engine: EmbeddedEngine,
) -> None:
    ids = prompt(engine, "Tell me a story.")
    sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=1234)
    alone = await engine.generate(ids, sampling, "seed-alone")
    other = SamplingParams(max_tokens=8, seed=99)
    batched, _ = await asyncio.gather(
        engine.generate(ids, sampling, "seed-batched"),
        engine.generate(prompt(engine, "Something else entirely"), other, "seed-other"),
    )
    assert batched.output_ids == alone.output_ids


async def test_greedy_stops_at_end_of_sequence_token(engine: EmbeddedEngine) -> None:
    result = await engine.generate(
        prompt(engine, "What is 2+2?"), SamplingParams(temperature=0, max_tokens=64), "eos"
    )
    assert result.finish_reason == "stop"
    assert result.output_ids[-1] in engine.eos_token_ids


async def test_stop_strings_and_stop_token_ids_end_generation(engine: EmbeddedEngine) -> None:
    ids = prompt(engine, "Write the numbers from 1 to 20 separated by commas.")
    free = await engine.generate(ids, SamplingParams(temperature=0, max_tokens=30), "free")
    text = engine.tokenizer.decode(free.output_ids)
    stop = text[4:6]
    by_string = await engine.generate(
        ids, SamplingParams(temperature=0, max_tokens=30, stop=(stop,)), "stop-str"
    )
    assert by_string.finish_reason == "stop"
    assert stop in engine.tokenizer.decode(by_string.output_ids)
    assert len(by_string.output_ids) < len(free.output_ids)
    token = free.output_ids[3]
    by_id = await engine.generate(
        ids, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(token,)), "stop-id"
    )
    assert by_id.output_ids == free.output_ids[: free.output_ids.index(token) + 1]
    assert by_id.finish_reason == "stop"


async def test_a_stop_string_matches_only_whole_characters(engine: EmbeddedEngine) -> None:
    # Greedy, the model answers with emoji of three byte-level tokens each: their first
    # tokens decode to U+FFFD, which the answer does not contain.
    ids = prompt(engine, "Reply with only an emoji: \U0001f600")
    greedy = SamplingParams(temperature=0, max_tokens=12)
    free = await engine.generate(ids, greedy, "emoji-free")
    assert engine.tokenizer.decode(free.output_ids[:1]) == "\ufffd"
    assert "\ufffd" not in engine.tokenizer.decode(free.output_ids)
    stop = greedy.replace(stop=("\ufffd",))
    stopped = await engine.generate(ids, stop, "emoji-stop")
    assert (stopped.output_ids, stopped.finish_reason) == (free.output_ids, free.finish_reason)


async def test_abort_stops_a_running_request(engine: EmbeddedEngine) -> None:
    ids = prompt(engine, "Write a very long essay about the sea.")
    sampling = SamplingParams(temperature=1.0, max_tokens=400, seed=3)
    task = asyncio.create_task(engine.generate(ids, sampling, "to-abort"))
    await asyncio.sleep(0)  # let the task run up to its first wait
    assert "to-abort" in engine._active
    await engine.abort("to-abort")
    result = await task
    assert result.finish_reason == "abort"
    assert len(result.output_ids) < 400
    assert "to-abort" not in engine._active


async def test_cancelling_the_caller_aborts_its_generation(engine: EmbeddedEngine) -> None:
    ids = prompt(engine, "Write a very long essay about mountains.")
    aborted_before = engine.aborted_total
    task = asyncio.create_task(engine.generate(ids, SamplingParams(max_tokens=400), "cancel-me"))
    await asyncio.sleep(0)  # let the task run up to its first wait
    assert "cancel-me" in engine._active
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The worker takes requests in order: once this one is answered, the cancelled one is done.
    await engine.generate(ids, SamplingParams(max_tokens=1), "after-cancel")
    assert engine.aborted_total == aborted_before + 1
    assert "cancel-me" not in engine._active


@pytest.mark.parametrize("bad", [[], [10**9], [-1]])
async def test_bad_input_ids_are_rejected(engine: EmbeddedEngine, bad: list[int]) -> None:
    with pytest.raises(InvalidFieldsError):
        await engine.generate(bad, SamplingParams(max_tokens=1), "bad")


async def test_a_shared_prompt_prefix_is_computed_once_and_stays_exact(
    engine: EmbeddedEngine,
) -> None:
    # Same long system prompt, different questions: the batch shares a prefix of ~40 tokens.
    system = "You are a careful assistant who answers in one short sentence. " * 3
    prompts = [
        engine.tokenizer.encode(
            engine.tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": q}],
                tokenize=False,
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )
        for q in ("Name a fruit.", "What colour is the sky on a clear day?", "Hi")
    ]
    sampling = SamplingParams(temperature=1.0, max_tokens=10, seed=5)
    saved = engine.prefix_tokens_saved
    results = await asyncio.gather(
        *[engine.generate(p, sampling, f"shared-{i}") for i, p in enumerate(prompts)]
    )
    assert engine.prefix_tokens_saved - saved >= 2 * 40
    for input_ids, result in zip(prompts, results, strict=True):
        expected = reference_logprobs(engine, input_ids, result.output_ids)
        assert result.logprobs == pytest.approx(expected, abs=1e-3)


def test_resolving_for_a_caller_whose_loop_closed_does_not_raise(engine: EmbeddedEngine) -> None:
    loop = asyncio.new_event_loop()
    request = Request(
        request_id="gone", input_ids=[1], sampling=SamplingParams(), max_new_tokens=1,
        loop=loop, future=loop.create_future(), generator=torch.Generator(),
    )  # fmt: skip
    loop.close()
    request.finish("abort")
    request.resolve()  # the worker thread calls this; raising here would kill it
    request.error = RuntimeError("also fine")
    request.resolve()
