"""GRPO steps on the embedded model, from the loop's own functions: the trainer's forward pass
reproduces the recorded logprobs before the first update, the update reaches the engine as a
new version, the next batch is sampled (and recorded) by exactly the new weights, and the step
source's figures land in ``metrics.jsonl`` beside the ratio check's."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator

import pytest
import torch
from examples.grpo.config import GRPOConfig
from examples.grpo.loop import (
    Trainer,
    make_client,
    next_batch,
    open_source,
    push_weights,
    run_step,
    train_step,
)
from examples.grpo.metrics import MetricsLog
from examples.grpo.objective import RatioCheckError, pack, token_logprobs
from examples.grpo.tasks import QUESTIONS, TaskSet

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient, StepSource
from rollway.results import AgentResult, RolloutRecord


class ReplyLengthAgent(AgentLoop):
    """One turn, rewarded by the reply's length in characters: rewards differ within a group
    (almost surely), so the first update has a gradient and moves the weights."""

    name = "reply-length"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [{"role": "user", "content": ctx.task["question"]}]
        reply = await ctx.chat(messages)
        reward = len(reply.content or "") / 40
        return ctx.complete([*messages, reply.message], reply.finish_reason, reward=reward)


Rig = tuple[RolloutClient, Trainer, GRPOConfig, TaskSet]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    # A large step and a KL reference: the test can tell the old weights from the new.
    config = GRPOConfig(
        prompts_per_step=2,
        group_size=3,
        max_tokens=8,
        lr=1e-4,
        kl_coef=0.05,
        out_dir=tmp_path_factory.mktemp("grpo"),
        plot=False,
        verbose=False,
    )
    rows = tuple({"task_id": f"q{i}", "question": q} for i, (q, _) in enumerate(QUESTIONS[:4]))
    task_set = TaskSet(ReplyLengthAgent, rows, max_tokens=8)
    with make_client(config, task_set) as client:
        yield client, Trainer(config, client.policy_version or 0), config, task_set


def sampled_versions(records: list[RolloutRecord]) -> set[int]:
    return {
        version
        for record in records
        for s in record.trajectory.samples
        for version, mask in zip(s.policy_versions, s.loss_mask, strict=True)
        if mask
    }


@pytest.mark.timeout(120)
def test_two_steps_train_on_policy_and_the_next_batch_is_the_updated_models(rig: Rig) -> None:
    client, trainer, config, task_set = rig
    with open_source(client, task_set, config) as source:
        batch = next_batch(source, 0)
        assert [len(group) for group in batch.groups] == [3, 3] and batch.lacking == 0
        first = batch.records
        two_steps_on_policy(client, trainer, config, source, first)


def two_steps_on_policy(
    client: RolloutClient,
    trainer: Trainer,
    config: GRPOConfig,
    source: StepSource,
    first: list[RolloutRecord],
) -> None:
    engine = client.gateway.gateway.engine
    start = trainer.version
    assert {r.policy_version for r in first} == sampled_versions(first) == {start}
    before = train_step(trainer, first, config)
    assert before["ratio_dev_on_policy"] < 1e-3 and before["stale_tokens"] == 0
    assert (
        before["on_policy_tokens"]
        == before["tokens"]
        == sum(len(t.completion_ids) for r in first for t in r.trajectory.turns)
    )
    assert before["grad_norm"] > 0
    # The mismatch metrics of the same recompute: on-policy, the behaviour policy's logprobs.
    assert before["logprob_diff_max_on_policy"] < config.ratio_tol
    assert before["logprob_diff_mean_on_policy"] <= before["logprob_diff_max_on_policy"]
    assert before["k3_kl_on_policy"] <= before["logprob_diff_max_on_policy"] ** 2  # ~ d^2 / 2
    assert before["ratio_outside_on_policy"] == 0.0
    assert before["logprob_diff_max_stale"] == before["k3_kl_stale"] == 0.0  # no stale token
    push_weights(client, trainer, config)
    assert trainer.version == client.policy_version == engine.policy_version == start + 1

    # Sync mode: nothing ran while the step trained, so the next batch is the new weights'.
    second = next_batch(source, 1).records
    assert {r.policy_version for r in second} == sampled_versions(second) == {start + 1}
    batch = pack([(s, 0.0) for r in second for s in r.trajectory.samples])
    with torch.no_grad():
        updated = token_logprobs(trainer.model, batch, config.temperature)
        initial = token_logprobs(trainer.reference, batch, config.temperature)
    assert float((updated - batch.behaviour_logprobs).abs().max()) < 1e-3
    # ... and not the initial weights': the update moved them.
    assert float((initial - batch.behaviour_logprobs).abs().max()) > 1e-2
    after = train_step(trainer, second, config)
    assert after["policy_version"] == start + 1 and after["ratio_dev_on_policy"] < 1e-3
    push_weights(client, trainer, config)  # the engine keeps the trainer's weights
    assert engine.policy_version == start + 2


@pytest.mark.timeout(120)
def test_async_samples_the_next_batch_during_a_step_and_its_stale_tokens_are_exact(
    rig: Rig,
) -> None:
    client, trainer, config, task_set = rig
    config = dataclasses.replace(config, async_rollouts=True, steps=2)
    start = trainer.version
    previous = copy.deepcopy(trainer.model)  # the weights batch 1 starts sampling with
    with open_source(client, task_set, config) as source:
        first = next_batch(source, 0)
        assert source.in_flight >= 1  # batch 1's groups run while step 0 trains
        train_step(trainer, first.records, config)
        push_weights(client, trainer, config)
        handed = next_batch(source, 1)
        second = handed.records
    batch = pack([(s, 0.0) for r in second for s in r.trajectory.samples])
    old = batch.versions == start
    with torch.no_grad():
        sampler = token_logprobs(previous, batch, config.temperature)
        current = token_logprobs(trainer.model, batch, config.temperature)
    metrics = train_step(trainer, second, config)
    push_weights(client, trainer, config)
    assert sampled_versions(second) <= {start, start + 1}
    assert metrics["stale_tokens"] == int(old.sum()) > 0
    assert metrics["on_policy_tokens"] == metrics["tokens"] - int(old.sum())
    assert handed.metrics.staleness.get(1) == metrics["stale_tokens"]  # the source's count
    # Stale tokens are exactly the previous weights' (the behaviour policy the loss corrects
    # with), and the update moved them: they are importance-weighted, not checked.
    assert float((sampler - batch.behaviour_logprobs)[old].abs().max()) < 1e-3
    assert metrics["ratio_dev_stale"] > 1e-3 and metrics["ratio_dev_on_policy"] < 1e-3
    # Their mismatch is the update's move, measured before the next one.
    moved = (current - batch.behaviour_logprobs)[old].double()
    assert metrics["logprob_diff_mean_stale"] == pytest.approx(float(moved.abs().mean()), rel=1e-3)
    assert metrics["logprob_diff_max_stale"] == pytest.approx(float(moved.abs().max()), rel=1e-3)
    k3 = float((moved.exp() - 1 - moved).mean())
    assert metrics["k3_kl_stale"] == pytest.approx(k3, rel=1e-2) and k3 > 0
    outside = float(((moved.exp() < 0.9) | (moved.exp() > 1.1)).double().mean())
    assert metrics["ratio_outside_stale"] == pytest.approx(outside)


@pytest.mark.timeout(120)
def test_a_recorded_logprob_the_model_does_not_give_fails_the_step_before_the_update(
    rig: Rig,
) -> None:
    client, trainer, config, task_set = rig
    with open_source(client, task_set, config) as source:
        records = next_batch(source, 0).records
    record = records[0]
    # The first sampled token of the first sample: its samples are made from the turns.
    segment = record.trajectory.samples[0].segment
    turns = list(record.trajectory.turns)
    at = next(i for i, t in enumerate(turns) if t.segment == segment and t.completion_ids)
    logprobs = list(turns[at].logprobs)
    logprobs[0] += 0.01
    turns[at] = turns[at].model_copy(update={"logprobs": logprobs})
    trajectory = record.trajectory.model_copy(update={"turns": turns})
    sample, was = trajectory.samples[0], record.trajectory.samples[0]
    first = sample.loss_mask.index(1)
    assert sample.logprobs[first] == was.logprobs[first] + 0.01
    assert sample.logprobs[first + 1 :] == was.logprobs[first + 1 :]
    forged = record.model_copy(update={"trajectory": trajectory})
    weight = trainer.model.get_decoder().norm.weight
    kept = weight.detach().clone()
    with pytest.raises(RatioCheckError, match=r"max \|ratio - 1\| = 9\.9\d+e-03 > 0\.001"):
        train_step(trainer, [forged, *records[1:]], config)
    assert torch.equal(weight, kept)  # no update was made


@pytest.mark.timeout(180)
def test_the_step_sources_figures_are_written_with_the_ratio_check_passing(
    rig: Rig, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Over-sampled: a group still running at the hand-over is carried into the next step.
    client, trainer, config, task_set = rig
    config = dataclasses.replace(config, over_sample=1.0)
    log = MetricsLog(tmp_path_factory.mktemp("log") / "metrics.jsonl")
    with open_source(client, task_set, config) as source:
        for step in range(2):
            log.write(run_step(client, trainer, source, step, config))
    written = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert written == log.steps and [m["step"] for m in written] == [0, 1]
    for m in written:
        assert m["ratio_dev_on_policy"] < config.ratio_tol == m["ratio_tol"]
        assert m["groups_used"] == 2 and m["lacking"] == 0 and m["set_aside_failed"] == 0
        assert m["set_aside_flat"] >= 0 and m["refilled"] == {} and m["failures"] == []
        assert 0 <= m["carried_over"] <= 2 and m["wait_s"] >= 0
        # Dynamic sampling (on): every group handed over has rewards that differ.
        assert m["informative_groups"] == m["groups_used"]
        # Every handed token, by versions behind the trainer's weights: 0 (checked) or 1
        # (importance-corrected, its mismatch logged apart).
        behind = {int(k): v for k, v in m["staleness"].items() if v}
        assert sum(behind.values()) == m["tokens"] and set(behind) <= {0, 1}
        assert behind.get(0, 0) == m["on_policy_tokens"] and behind.get(1, 0) == m["stale_tokens"]
    assert written[0]["staleness"] == {"0": written[0]["tokens"]}
