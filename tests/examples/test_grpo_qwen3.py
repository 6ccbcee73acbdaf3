"""A GRPO step on Qwen3: a small random-initialised Qwen3 (the real tokenizer and template)
samples on the embedded engine through the gateway's Qwen3 renderer, in two-turn chats (two
sampled spans in one sample, the template's glue between them masked out); the trainer's
forward pass reproduces the recorded logprobs (the ratio check passes before the update), and
after the update the engine samples with the trainer's new weights."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from examples.grpo.config import GRPOConfig
from examples.grpo.loop import (
    Trainer,
    make_client,
    next_batch,
    open_source,
    push_weights,
    train_step,
)
from examples.grpo.objective import pack, token_logprobs
from examples.grpo.tasks import QUESTIONS, TaskSet

from rollway.agents import AgentLoop, RolloutContext
from rollway.results import AgentResult
from tests.engines.embedded.test_embedded_qwen3 import tiny_qwen3

__all__ = ["tiny_qwen3"]  # the fixture, imported to be found


class FollowUpAgent(AgentLoop):
    """Two turns (a question, then "Go on."), rewarded by the replies' length in characters:
    rewards differ within a group (almost surely), so the update has a gradient."""

    name = "follow-up"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [{"role": "user", "content": ctx.task["question"]}]
        first = await ctx.chat(messages)
        messages += [first.message, {"role": "user", "content": "Go on."}]
        second = await ctx.chat(messages)
        reward = (len(first.content or "") + len(second.content or "")) / 40
        return ctx.complete([*messages, second.message], second.finish_reason, reward=reward)


@pytest.fixture
def config(tiny_qwen3: Path, tmp_path: Path) -> Iterator[GRPOConfig]:
    yield GRPOConfig(
        model=str(tiny_qwen3),
        prompts_per_step=2,
        group_size=2,
        max_tokens=6,
        lr=1e-2,  # a large step: the new weights' logprobs differ visibly
        dynamic_sampling=False,
        out_dir=tmp_path,
        plot=False,
        verbose=False,
    )


@pytest.mark.timeout(180)
def test_a_grpo_step_on_a_small_qwen3_passes_the_ratio_check(config: GRPOConfig) -> None:
    rows = tuple({"task_id": f"q{i}", "question": q} for i, (q, _) in enumerate(QUESTIONS[:2]))
    task_set = TaskSet(FollowUpAgent, rows, max_tokens=6)
    with make_client(config, task_set) as client:
        assert client.gateway.gateway.renderer.name == "qwen3"
        trainer = Trainer(config, client.policy_version or 0)
        assert type(trainer.model).__name__ == "Qwen3ForCausalLM"
        with open_source(client, task_set, config) as source:
            records = next_batch(source, 0).records
            samples = [s for r in records for s in r.trajectory.samples]
            assert len(samples) == len(records) == 4  # each two-turn chat is one sample
            assert all(len(r.trajectory.turns) == 2 for r in records)
            initial = copy.deepcopy(trainer.model)
            before = train_step(trainer, records, config)
            # The ratio check passed (train_step raises RatioCheckError otherwise) on every
            # sampled token, both turns of each sample.
            assert before["ratio_dev_on_policy"] < config.ratio_tol
            sampled = sum(len(t.completion_ids) for r in records for t in r.trajectory.turns)
            assert before["on_policy_tokens"] == before["tokens"] == sampled
            assert before["grad_norm"] > 0
            push_weights(client, trainer, config)
            # The next batch is the new weights': its ratio check passes against them, and
            # would not against the weights before the update.
            second = next_batch(source, 1).records
            batch = pack([(s, 0.0) for r in second for s in r.trajectory.samples])
            with torch.no_grad():
                old = token_logprobs(initial, batch, config.temperature)
            assert float((old - batch.behaviour_logprobs).abs().max()) > 1e-2
            after = train_step(trainer, second, config)
    assert after["policy_version"] == before["policy_version"] + 1
    assert after["ratio_dev_on_policy"] < config.ratio_tol
