"""The GRPO example (examples/grpo) with the real vLLM server as its engine (the real leg
only: `make test-vllm`): sampled at temperature 0.7 with processed logprobs, weights pushed
from the trainer as a checkpoint folder every step, and the ratio check passing on every step
against the logprobs vLLM recorded. Runs after the conformance suite: it restarts the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from examples.grpo.config import GRPOConfig
from examples.grpo.loop import run

from .vllm_servers import REAL, RealVLLM


@getattr(pytest.mark, REAL)
def test_grpo_on_real_vllm_passes_the_ratio_check_at_every_step(
    real_vllm: RealVLLM, tmp_path: Path
) -> None:
    if "processed_logprobs" not in real_vllm.flags:  # the conformance suite's restarts set it
        real_vllm.restart("--logprobs-mode", "processed_logprobs", "--enforce-eager")
    config = GRPOConfig(
        engine=f"vllm://127.0.0.1:{real_vllm.port}?logprobs_mode=processed_logprobs",
        steps=3,
        prompts_per_step=3,
        group_size=3,
        max_tokens=8,
        out_dir=tmp_path,
        plot=False,
        verbose=False,
    )
    steps = run(config)
    start = steps[0]["policy_version"]
    # Each step trained on what the weights it had just pushed sampled, all of it on-policy.
    assert [m["policy_version"] for m in steps] == [start, start + 1, start + 2]
    for metrics in steps:
        assert metrics["on_policy_tokens"] == metrics["tokens"] > 0
        assert metrics["ratio_dev_on_policy"] < config.ratio_tol, metrics
    # Some step before the last moved the weights, so a later ratio check tested new ones. A
    # step whose groups each got one reward throughout has no advantage and no gradient (the
    # second step of a run with 2 groups a step did); with 3, two such steps in a row are rare.
    assert any(m["grad_norm"] > 0 for m in steps[:-1]), steps
    assert (tmp_path / "metrics.jsonl").is_file()
    # The last checkpoint stays for a restart's replay; the ones before the previous are gone.
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == [
        f"v{start + 2}",
        f"v{start + 3}",
    ]
