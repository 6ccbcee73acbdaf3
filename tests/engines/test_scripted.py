"""The scripted engine answers its completions in order, with a distinct logprob per token,
from a list in-process or a file through the engine factory (``scripted://FILE``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rollway.engines.factory import engine_from_spec
from rollway.engines.scripted import ScriptedEngine
from rollway.engines.streaming import collect
from rollway.errors import ConfigError, EngineError
from rollway.gateway.factory import build_gateway
from rollway.generation import GenerationChunk, SamplingParams

QWEN3_ANSWER = "<think>\nSay hi.\n</think>\n\nHi!<|im_end|>"


def test_answers_in_order_with_distinct_logprobs_then_refuses_one_more() -> None:
    engine = ScriptedEngine([[5, 6, 7], {"ids": [8], "logprobs": [-2.5]}, [9, 10]])
    sampling = SamplingParams(max_tokens=16)

    async def run() -> list[object]:
        first = await engine.generate([1, 2], sampling, "r-1")
        second = await engine.generate([3], sampling, "r-2")
        third = await engine.generate([4], SamplingParams(max_tokens=1), "r-3")
        with pytest.raises(EngineError, match="answered all its 3 completions"):
            await engine.generate([4], sampling, "r-4")
        return [first, second, third]

    first, second, third = asyncio.run(run())
    assert (first.output_ids, first.logprobs, first.finish_reason) == (
        [5, 6, 7],
        [-0.001, -0.002, -0.003],
        "stop",
    )
    assert (second.output_ids, second.logprobs) == ([8], [-2.5])
    assert (third.output_ids, third.logprobs, third.finish_reason) == ([9], [-0.005], "length")
    assert engine.prompts == [[1, 2], [3], [4]]
    assert engine.remaining == 0


def test_a_stream_is_the_answer_token_by_token() -> None:
    async def chunks() -> list[GenerationChunk]:
        stream = ScriptedEngine([[5, 6, 7]]).generate_stream([1], SamplingParams(), "r")
        return [chunk async for chunk in stream]

    parts = asyncio.run(chunks())
    assert [part.output_ids for part in parts] == [[5], [6], [7]]
    whole = collect(parts)
    assert (whole.output_ids, whole.logprobs, whole.finish_reason) == (
        [5, 6, 7],
        [-0.001, -0.002, -0.003],
        "stop",
    )


def test_text_needs_a_tokenizer_and_a_bad_item_is_named() -> None:
    with pytest.raises(ConfigError, match="completion 0 is text: give the engine a tokenizer"):
        ScriptedEngine(["hi"])
    with pytest.raises(ConfigError, match="completion 1 is neither text nor a list of token"):
        ScriptedEngine([[1], [1.5]])
    with pytest.raises(ConfigError, match="completion 0 needs one number in 'logprobs'"):
        ScriptedEngine([{"ids": [1, 2], "logprobs": [-1.0]}])


def test_a_script_file_is_encoded_with_the_model_folders_tokenizer(
    tmp_path: Path, qwen3_folder: Path
) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps(QWEN3_ANSWER) + "\n" + json.dumps([151645]) + "\n")
    engine = engine_from_spec(f"scripted://{script}", model=str(qwen3_folder))
    assert isinstance(engine, ScriptedEngine)
    result = asyncio.run(engine.generate([1], SamplingParams(), "r"))
    tokenizer = AutoTokenizer.from_pretrained(qwen3_folder)
    # The special token written as text is its one id, as the model samples it.
    assert result.output_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(result.output_ids) == QWEN3_ANSWER
    assert engine.remaining == 1


def test_an_unreadable_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the script"):
        ScriptedEngine.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[1,\n")
    with pytest.raises(ConfigError, match="neither a JSON list nor JSON lines"):
        ScriptedEngine.from_file(bad)


def test_a_gateway_over_a_script_answers_it(tmp_path: Path, qwen3_folder: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["Hello there.<|im_end|>"]))
    gateway = build_gateway(f"scripted://{script}", model=str(qwen3_folder))
    gateway.register("r1", {})

    answer = asyncio.run(gateway.chat("r1", {"messages": [{"role": "user", "content": "hi"}]}))
    assert answer.message["content"] == "Hello there."
    assert answer.finish_reason == "stop"
