"""The embedded engine runs the Qwen3 architecture (q/k norms, its rope): a small
random-initialised Qwen3 with the real tokenizer's vocabulary samples with the logprobs of a
fresh transformers forward pass, batched and across turns (the prefix cache)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rollway.engines.embedded import EmbeddedEngine
from rollway.generation import SamplingParams
from tests.engines.embedded.test_embedded import next_turn, prompt, reference_logprobs


@pytest.fixture(scope="module")
def tiny_qwen3(qwen3_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Qwen3-8B's config, shrunk (2 layers of 64), random weights, the real tokenizer."""
    fields = json.loads((qwen3_folder / "config.json").read_text())
    fields |= {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "max_window_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "tie_word_embeddings": True,
    }
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_folder / name, folder / name)
    yield folder


@pytest.fixture(scope="module")
def qwen3_engine(tiny_qwen3: Path) -> Iterator[EmbeddedEngine]:
    engine = EmbeddedEngine.from_pretrained(tiny_qwen3)
    yield engine
    asyncio.run(engine.close())


def test_it_is_the_qwen3_architecture(qwen3_engine: EmbeddedEngine) -> None:
    attention = qwen3_engine.model.model.layers[0].self_attn
    assert type(qwen3_engine.model).__name__ == "Qwen3ForCausalLM"
    assert hasattr(attention, "q_norm") and hasattr(attention, "k_norm")


def test_batched_logprobs_across_turns_equal_a_fresh_forward_pass(
    qwen3_engine: EmbeddedEngine,
) -> None:
    engine = qwen3_engine
    prompts = [prompt(engine, q) for q in ("Hi", "Name three colors of the rainbow, please.")]
    sampling = SamplingParams(temperature=1.0, max_tokens=8, seed=7)

    async def run() -> None:
        results = await asyncio.gather(
            *[engine.generate(p, sampling, f"q-{i}") for i, p in enumerate(prompts)]
        )
        follow_ups = [next_turn(engine, p, r) for p, r in zip(prompts, results, strict=True)]
        hits = engine.prefix_cache.hits
        # The second turns reuse the first turns' KV (the prefix cache).
        again = await asyncio.gather(
            *[engine.generate(p, sampling, f"q2-{i}") for i, p in enumerate(follow_ups)]
        )
        assert engine.prefix_cache.hits > hits
        for input_ids, result in zip(prompts + follow_ups, results + again, strict=True):
            assert len(result.output_ids) == len(result.logprobs) > 0
            expected = reference_logprobs(engine, input_ids, result.output_ids)
            assert result.logprobs == pytest.approx(expected, abs=1e-3)

    asyncio.run(run())
