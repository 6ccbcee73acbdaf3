"""verl's trainer takes its batches from a step source (verl 0.9.1, in .venv-verl): real
rollouts go through ``StepSourceManager.generate_sequences``, padded by verl's own
``AgentLoopWorker``, then through what verl's ``fit()`` does with them: its ``_get_gen_batch``
and ``repeat`` before, the union with its own batch and ``compute_grpo_outcome_advantage``
on the ``uid``s after. Each row must be a handed-over sample, the batch whole groups."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from rollway.client import RolloutClient, StepSource
from rollway.errors import ConfigError
from rollway.trainers.verl import RowAgent, close_clients, use_client
from rollway.trainers.verl_steps import StepSourceManager
from tests.trainers.test_trl_steps import ParityAgent, tasks
from tests.trainers.verl.test_verl_agent_loop import (
    check_masks_and_logprobs,
    check_row,
    rows,
    verl_config,
)

CALL_TOKENS = 8


def step_config(n: int = 2, temperature: float = 1.0, top_k: int = -1) -> DictConfig:
    """verl's defaults, with ``rollout.n`` samples a prompt at that sampling."""
    config = verl_config()
    rollout = config.actor_rollout_ref.rollout
    rollout.n, rollout.temperature, rollout.top_k = n, temperature, top_k
    return config


def manager(client: RolloutClient, source: StepSource, **config: Any) -> StepSourceManager:
    return StepSourceManager(step_config(**config), client, source)


def fit_batches(prompts: int, n: int) -> tuple[DataProto, DataProto]:
    """What ``fit()`` makes of ``prompts`` dataset rows: its own batch (a uid a prompt,
    repeated ``n`` times in a row) and the one it hands ``generate_sequences``."""
    batch = rows(["pace"] * prompts, [None] * prompts)
    batch.batch = DataProto.from_dict(
        {"dummy_tensor": torch.zeros(prompts, 1, dtype=torch.uint8)}
    ).batch  # RLHFDataset's one tensor
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(prompts)],
                                             dtype=object)  # fmt: skip
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # verl's own split, self unused
    return batch.repeat(n, interleave=True), gen_batch.repeat(n, interleave=True)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutClient]:
    store = tmp_path_factory.mktemp("verl-steps")
    with RolloutClient(ParityAgent, "embedded", store=str(store), max_tokens=CALL_TOKENS) as c:
        yield c


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[RolloutClient]:
    with RolloutClient(ParityAgent, "sim", store=str(tmp_path / "runs")) as made:
        yield made


async def test_verl_trains_on_the_step_sources_whole_groups_exactly(
    embedded: RolloutClient,
) -> None:
    source = embedded.step_source(tasks("flat1", "a", "flat2", "b"), group_size=2,
                                  groups_per_step=2, temperature=0.7, top_k=20)  # fmt: skip
    with source:
        steps = manager(embedded, source, temperature=0.7, top_k=20)
        batch, prompts = fit_batches(prompts=2, n=2)
        out = await steps.generate_sequences(prompts)
    (handed,) = steps.batches
    assert handed.metrics.set_aside_flat == 2 and handed.lacking == 0
    assert sorted(group[0].task["task_id"] for group in handed.groups) == ["a", "b"]
    assert "agent_loop/generate_sequences/mean" in out.meta_info["timing"]  # fit() reads it

    # Whole groups, contiguous, in the order handed over; each row its record's sample.
    records = handed.records
    keys = list(out.non_tensor_batch["rollway_rollout_key"])
    assert keys == [record.rollout_key for record in records]
    assert list(out.non_tensor_batch["rollway_group_id"]) == [r.group_id for r in records]
    assert list(out.non_tensor_batch["rollway_sample_index"]) == [0, 1, 0, 1]
    pad = steps.worker.tokenizer.pad_token_id
    for row, key in enumerate(keys):
        record = embedded.store.get(key)
        assert record is not None and record.trajectory is not None
        (sample,) = record.trajectory.samples
        check_row(out.batch, row, sample.prompt_ids, sample.response_ids, pad)
        check_masks_and_logprobs(out.batch, row, sample.loss_mask, sample.logprobs)
        assert record.reward is not None
        assert out.batch["rm_scores"][row].sum().item() == record.reward
        assert record.trajectory.sampling["temperature"] == 0.7

    # fit() unions its own batch with the output: the uids must agree, one per group.
    trained = batch.union(out)
    uids = trained.non_tensor_batch["uid"]
    assert uids[0] == uids[1] != uids[2] == uids[3]
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=trained.batch["rm_scores"],
        response_mask=trained.batch["response_mask"],
        index=uids,
    )
    for row, record in enumerate(records):
        group = [r.reward for r in records if r.group_id == record.group_id]
        scores = torch.tensor(group)
        expected = (record.reward - scores.mean()) / (scores.std() + 1e-6)
        mask = trained.batch["response_mask"][row].bool()
        assert abs(expected.item()) > 0.5  # each group holds a 0 and a 1
        assert torch.allclose(advantages[row][mask], expected.expand(int(mask.sum())))
        assert advantages[row][~mask].count_nonzero().item() == 0


@pytest.mark.timeout(120)
async def test_a_short_batch_is_filled_from_the_next_across_steps(sim: RolloutClient) -> None:
    # No extra group a step: the flat group leaves the first batch one group short.
    names = ["a", "flat", "b", "c", "d", "e"]
    source = sim.step_source(tasks(*names), group_size=2, groups_per_step=2, max_extra_groups=0)
    with source:
        steps = manager(sim, source)
        first = await steps.generate_sequences(rows(["x"] * 4, [None] * 4))
        assert [batch.lacking for batch in steps.batches] == [1, 0]
        second = await steps.generate_sequences(rows(["x"] * 4, [None] * 4))
        left = [group[0].task["task_id"] for group in steps.rounds.left_over]
    handed = []
    for out in (first, second):
        # Without a uid column from the trainer, each row's uid is its rollway group.
        groups = list(out.non_tensor_batch["rollway_group_id"])
        assert list(out.non_tensor_batch["uid"]) == groups
        assert groups[0] == groups[1] != groups[2] == groups[3]
        records = [sim.store.get(key) for key in out.non_tensor_batch["rollway_rollout_key"]]
        handed += [r.task["task_id"] for r in records[::2] if r is not None]
    assert handed[0] == "a" and len(handed) == 4 and len(left) == 1
    assert sorted(handed + left) == ["a", "b", "c", "d", "e"]


def unpaired_uids(prompts: DataProto) -> DataProto:
    prompts.non_tensor_batch["uid"] = np.array(["u0", "u1", "u0", "u1"], dtype=object)
    return prompts


def remax(prompts: DataProto) -> DataProto:
    prompts.non_tensor_batch["__do_sample__"] = np.ones(len(prompts), dtype=bool)
    return prompts


@pytest.mark.parametrize(
    ("count", "config", "edit", "named"),
    [(6, {}, None, "train_batch_size"), (4, {"n": 4}, None, "rollout.n"),
     (4, {"temperature": 0.7}, None, "temperature"), (4, {"top_k": 20}, None, "top_k"),
     (4, {}, unpaired_uids, "uid"), (4, {}, remax, "adv_estimator")],
)  # fmt: skip
async def test_a_batch_the_step_does_not_fit_is_refused_before_any_rollout(
    sim: RolloutClient, count: int, config: dict[str, Any], edit: Any, named: str
) -> None:
    prompts = rows(["x"] * count, [None] * count)
    if edit is not None:
        prompts = edit(prompts)
    source = sim.step_source(tasks("a", "b"), group_size=2, groups_per_step=2)
    with source, pytest.raises(ConfigError, match=named) as refused:
        await manager(sim, source, **config).generate_sequences(prompts)
    assert refused.value.param == named
    assert list(sim.store.records()) == []


async def test_validation_goes_to_evaluate_or_is_refused(tmp_path: Path) -> None:
    prompts = rows(["Name a colour."], [None])
    prompts.meta_info["validate"] = True
    with RolloutClient(RowAgent, "sim", store=str(tmp_path / "runs")) as client:
        source = client.step_source(tasks("a"), group_size=2, groups_per_step=1)
        with source:
            with pytest.raises(ConfigError, match="val_before_train") as refused:
                await manager(client, source).generate_sequences(prompts)
            assert refused.value.param == "evaluate"
            # verl's own worker runs the validation rows (rollway's agent loop, this client).
            use_client(client)
            try:
                worker = AgentLoopWorker(step_config(), llm_client=None)
                steps = StepSourceManager(step_config(), client, source, evaluate=worker)
                out = await steps.generate_sequences(prompts)
            finally:
                close_clients()
        ran = [record.task["messages"] for record in client.store.records()]
    assert ran == [[{"role": "user", "content": "Name a colour."}]]
    assert len(out) == 1 and steps.batches == []
