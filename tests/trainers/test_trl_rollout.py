"""The TRL rollout function over the simulated engine, without TRL: groups, order, failed
and multi-segment rollouts, and when the trainer's weights are pushed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.errors import BadRecordError, ConfigError
from rollway.results import AgentResult
from rollway.trainers.trl import (
    PromptAgent,
    rollway_reward,
    rollway_rollout_func,
    trainer_sampling,
    trl_columns,
)


class PickyAgent(AgentLoop):
    """Like ``PromptAgent``, but gives up on "fail" and rewrites the conversation on "fold"."""

    name = "picky"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        prompt = ctx.task["prompt"]
        if prompt == "fail":
            return ctx.error("no")
        reply = await ctx.chat([{"role": "user", "content": prompt}])
        if prompt == "fold":  # a new conversation: a second segment
            reply = await ctx.chat([{"role": "user", "content": "summary"}])
        return ctx.complete([reply.message], reward=float(len(prompt)))


def fake_trainer(generations: int = 2, eval_generations: int = 1, **config: Any) -> Any:
    """The parts of a ``GRPOTrainer`` the rollout function reads; ``config`` sets its
    ``GRPOConfig`` sampling fields (TRL's defaults otherwise)."""
    model = torch.nn.Linear(2, 2)
    args = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None,
            "max_completion_length": None, "repetition_penalty": 1.0,
            "generation_kwargs": None}  # fmt: skip
    return SimpleNamespace(
        args=SimpleNamespace(**{**args, **config}),
        state=SimpleNamespace(global_step=0),
        model=model,
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
        num_generations=generations,
        num_generations_eval=eval_generations,
        processing_class=SimpleNamespace(eos_token_id=2),
    )


@pytest.fixture
def client(tmp_path: Path) -> Iterator[RolloutClient]:
    with RolloutClient(PickyAgent, engine="sim", store=str(tmp_path / "runs")) as made:
        yield made


def test_equal_prompt_runs_are_groups_returned_in_prompt_order(client: RolloutClient) -> None:
    func = rollway_rollout_func(client, sync_weights=False)
    out = func(["a", "a", "bb", "bb"], fake_trainer())
    records = {r.rollout_id: r for r in client.store.records()}
    rows = [records[rid] for rid in out["rollway_rollout_id"]]
    assert [r.task["prompt"] for r in rows] == ["a", "a", "bb", "bb"]
    assert [r.sample_index for r in rows] == [0, 1, 0, 1]
    groups = [r.group_id for r in rows]
    assert groups[0] == groups[1] != groups[2] == groups[3]
    for row, prompt_ids, completion_ids, mask, logprobs in zip(
        rows, out["prompt_ids"], out["completion_ids"], out["env_mask"], out["logprobs"],
        strict=True,
    ):  # fmt: skip
        assert row.trajectory is not None
        (sample,) = row.trajectory.samples
        assert prompt_ids == sample.prompt_ids and completion_ids == sample.response_ids
        assert mask == sample.loss_mask and logprobs == sample.logprobs
    assert out["rollway_reward"] == [1.0, 1.0, 2.0, 2.0]
    assert rollway_reward(completions=[""] * 4, **out) == [1.0, 1.0, 2.0, 2.0]


def test_a_split_group_runs_each_prompt_alone(client: RolloutClient) -> None:
    # On several processes TRL can hand one process half of a group.
    out = rollway_rollout_func(client, sync_weights=False)(["a", "b", "b", "c"], fake_trainer())
    groups = {r.group_id for r in client.store.records()}
    assert len(out["completion_ids"]) == 4 and len(groups) == 4


def test_eval_rounds_group_by_the_eval_generations(client: RolloutClient) -> None:
    trainer = fake_trainer(generations=2, eval_generations=3)
    trainer.model.eval()
    rollway_rollout_func(client, sync_weights=False)(["a"] * 3, trainer)
    assert {r.sample_index for r in client.store.records()} == {0, 1, 2}


def test_a_failed_rollout_is_one_masked_token_without_reward(client: RolloutClient) -> None:
    out = rollway_rollout_func(client, sync_weights=False)(["fail", "ok"], fake_trainer(1))
    assert out["rollway_status"] == ["error", "completed"]
    assert (out["prompt_ids"][0], out["completion_ids"][0], out["env_mask"][0]) == ([2], [2], [0])
    assert out["rollway_reward"] == [None, 2.0]
    assert out["env_mask"][1] == [1] * len(out["completion_ids"][1])


def test_a_rewritten_conversation_is_refused(client: RolloutClient) -> None:
    with pytest.raises(ConfigError, match="2 segments"):
        rollway_rollout_func(client, sync_weights=False)(["fold"], fake_trainer(1))


def test_a_record_whose_logprobs_do_not_line_up_is_refused_naming_it(
    client: RolloutClient,
) -> None:
    rollway_rollout_func(client, sync_weights=False)(["ok"], fake_trainer(1))
    (record,) = client.store.records()
    assert record.trajectory is not None
    (first,) = record.trajectory.turns
    short = first.model_copy(update={"logprobs": first.logprobs[:-1]})
    trajectory = record.trajectory.model_copy(update={"turns": [short]})
    bad = record.model_copy(update={"trajectory": trajectory})
    tokens = len(first.completion_ids)
    with pytest.raises(BadRecordError) as refused:
        trl_columns([bad], eos_id=2)
    assert str(refused.value) == (
        f"rollout {record.rollout_id}: turn 0: {tokens - 1} logprobs for {tokens} completion ids"
    )


def test_weights_are_pushed_before_the_first_round_and_each_new_step(tmp_path: Path) -> None:
    with RolloutClient(PromptAgent, engine="sim", store=str(tmp_path)) as client:
        engine = client.gateway.gateway.engine
        func = rollway_rollout_func(client)
        trainer = fake_trainer(1)
        for step in (0, 0, 1):  # step 0 twice (an eval round, say), then step 1
            trainer.state.global_step = step
            out = func([[{"role": "user", "content": "hi"}]], trainer)
        assert [version for _, version in engine.updates] == [1, 2]
        (source, _) = engine.updates[-1]
        assert source.keys() == trainer.model.state_dict().keys()
        assert out["rollway_policy_version"] == [2]


def test_rounds_sample_with_the_trainers_temperature_top_p_top_k_and_length(
    client: RolloutClient,
) -> None:
    func = rollway_rollout_func(client, sync_weights=False)
    trainer = fake_trainer(temperature=0.7, top_p=0.9, top_k=20, max_completion_length=5)
    out = func(["a", "a"], trainer)
    records = {r.rollout_id: r for r in client.store.records()}
    for rollout_id in out["rollway_rollout_id"]:
        (turn,) = records[rollout_id].trajectory.turns
        assert (turn.sampling["temperature"], turn.sampling["top_p"]) == (0.7, 0.9)
        assert (turn.sampling["top_k"], turn.sampling["max_tokens"]) == (20, 5)


@pytest.mark.parametrize(
    ("field", "value"),
    [("repetition_penalty", 1.1), ("min_p", 0.05), ("generation_kwargs", {"typical_p": 0.9})],
)
def test_sampling_rollway_cannot_do_is_refused_naming_the_field(
    client: RolloutClient, field: str, value: Any
) -> None:
    func = rollway_rollout_func(client, sync_weights=False)
    with pytest.raises(ConfigError, match=f"GRPOConfig.{field}"):
        func(["a", "a"], fake_trainer(**{field: value}))
    assert list(client.store.records()) == []  # refused before any rollout ran


# A deprecated transformers name that TRL 1.16 still sets; not ours to fix.
@pytest.mark.filterwarnings(r"ignore:`(is_)?gradient_checkpointing\w*` is deprecated:FutureWarning")
def test_the_real_grpo_config_fields_are_the_ones_read(tmp_path: Path) -> None:
    trl = pytest.importorskip("trl")  # a dev dependency: installed wherever the suite runs
    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        temperature=0.7,
        top_k=5,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    assert trainer_sampling(args) == {
        "temperature": 0.7, "top_p": 1.0, "top_k": 5, "max_tokens": args.max_completion_length
    }  # fmt: skip
