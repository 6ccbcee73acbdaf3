"""The short version of benchmarks/gateway_overhead.py's family and shared-prefix sections:
each family's tool loop is one sample per rollout through the benchmark's engine, and tasks
sharing a system prompt and tools tokenize the shared part once by pieces."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.gateway_overhead import parse
from benchmarks.tool_loop_cost import families, shared_prefix


@pytest.mark.timeout(300)
def test_each_familys_tool_loop_is_measured_as_one_sample_per_rollout(qwen3_folder: Path) -> None:
    runs = families(["smollm2", str(qwen3_folder)], rollouts=4, turns=3, repeats=1)
    for (cost,) in runs.values():
        assert cost.turns == 12 and cost.cpu_s > 0 and cost.encoded_chars > 0
        assert cost.segments == [1, 1, 1, 1]


@pytest.mark.timeout(300)
def test_shared_prefixes_are_tokenized_once_by_pieces(qwen3_folder: Path) -> None:
    costs = shared_prefix(str(qwen3_folder), tokens=2000, rollouts=8, turns=2)
    whole, pieces = costs["whole prompts"], costs["by pieces"]
    assert whole.segments == pieces.segments == [1] * 8
    # Eight tasks' 2k shared tokens encoded eight times, against once (twice: the first
    # prompt is audited against its whole text) plus the questions.
    assert pieces.encoded_chars < whole.encoded_chars / 3


def test_the_benchmark_takes_a_model_and_sections() -> None:
    args = parse(["--model", "qwen3", "--section", "families", "--section", "prefix"])
    assert args.model == "qwen3" and args.section == ["families", "prefix"]
