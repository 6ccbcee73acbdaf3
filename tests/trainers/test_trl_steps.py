"""TRL's rollout function over a step source, on the simulated engine with TRL's trainer faked
(``fake_trainer``): each round is the source's whole groups, flat ones set aside, a short batch
filled from the next without losing a group, and the round's shape and sampling checked
against the trainer's before any batch is taken."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient, StepSource
from rollway.errors import ConfigError
from rollway.results import AgentResult, RolloutRecord
from rollway.trainers.trl_steps import step_rollout_func
from tests.trainers.test_trl_rollout import fake_trainer


class ParityAgent(AgentLoop):
    """One model call; reward: the sample's parity (an informative group), or 0.5 for every
    sample of a ``flat`` task (no advantage)."""

    name = "parity"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        sample = int(ctx.rollout_id.rsplit(".", 2)[-2])
        messages = [{"role": "user", "content": ctx.task["q"]}]
        reply = await ctx.chat(messages)
        reward = 0.5 if ctx.task.get("flat") else float(sample % 2)
        return ctx.complete([*messages, reply.message], reward=reward)


def tasks(*names: str) -> list[dict[str, Any]]:
    """A task per name; a name starting with ``flat`` makes a flat group."""
    return [{"task_id": name, "q": name, "flat": name.startswith("flat")} for name in names]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[RolloutClient]:
    with RolloutClient(ParityAgent, engine="sim", store=str(tmp_path / "runs")) as made:
        yield made


def source_of(client: RolloutClient, names: list[str], **options: Any) -> StepSource:
    return client.step_source(tasks(*names), group_size=2, groups_per_step=2, **options)


def returned(client: RolloutClient, out: dict[str, list[Any]]) -> list[RolloutRecord]:
    """The records of the rows a round returned, in row order."""
    records = {r.rollout_id: r for r in client.store.records()}
    return [records[rollout_id] for rollout_id in out["rollway_rollout_id"]]


def group_tasks(rows: list[RolloutRecord]) -> list[str]:
    """The task of each group of rows, asserting the rows are whole groups in sample order."""
    names = []
    for start in range(0, len(rows), 2):
        first, second = rows[start : start + 2]
        assert first.group_id == second.group_id
        assert (first.sample_index, second.sample_index) == (0, 1)
        names.append(first.task["task_id"])
    return names


@pytest.mark.timeout(60)
def test_a_round_is_the_sources_whole_groups_with_flat_ones_set_aside(
    client: RolloutClient,
) -> None:
    with source_of(client, ["flat1", "a", "flat2", "b"]) as source:
        func = step_rollout_func(client, source, sync_weights=False)
        out = func(["ignored"] * 4, fake_trainer(generations=2))
    rows = returned(client, out)
    assert sorted(group_tasks(rows)) == ["a", "b"]
    assert out["rollway_reward"] == [0.0, 1.0, 0.0, 1.0]
    (batch,) = func.batches
    assert batch.metrics.set_aside_flat == 2 and batch.lacking == 0
    # The rows are the records' samples, as rollway_rollout_func maps them.
    for row, record in enumerate(rows):
        assert record.trajectory is not None
        (sample,) = record.trajectory.samples
        assert out["prompt_ids"][row] == sample.prompt_ids
        assert out["completion_ids"][row] == sample.response_ids
        assert out["env_mask"][row] == sample.loss_mask
        assert out["logprobs"][row] == sample.logprobs


@pytest.mark.timeout(60)
def test_a_short_batch_is_filled_from_the_next_and_no_group_is_lost(
    client: RolloutClient,
) -> None:
    # No extra group a step: the flat group leaves the first batch one group short.
    names = ["a", "flat", "b", "c", "d", "e"]
    with source_of(client, names, max_extra_groups=0) as source:
        func = step_rollout_func(client, source, sync_weights=False)
        first = group_tasks(returned(client, func(["x"] * 4, fake_trainer())))
        assert [batch.lacking for batch in func.batches] == [1, 0]
        second = group_tasks(returned(client, func(["x"] * 4, fake_trainer())))
        left = [group[0].task["task_id"] for group in func.rounds.left_over]
    assert first[0] == "a" and len(first) == len(second) == 2 and len(left) == 1
    assert sorted(first + second + left) == ["a", "b", "c", "d", "e"]


@pytest.mark.timeout(60)
def test_running_out_of_tasks_says_so(client: RolloutClient) -> None:
    with source_of(client, ["a", "b"]) as source:
        func = step_rollout_func(client, source, sync_weights=False)
        func(["x"] * 4, fake_trainer())
        with pytest.raises(ConfigError, match=r"run out of tasks.*max_steps"):
            func(["x"] * 4, fake_trainer())


@pytest.mark.timeout(60)
def test_weights_are_pushed_before_each_new_steps_batch(client: RolloutClient) -> None:
    engine = client.gateway.gateway.engine
    trainer = fake_trainer()
    with source_of(client, ["a", "b", "c", "d"]) as source:
        func = step_rollout_func(client, source)
        for step in (0, 1):
            trainer.state.global_step = step
            out = func(["x"] * 4, trainer)
            # Every group started after this step's weights went in: none was carried over.
            assert out["rollway_policy_version"] == [step + 1] * 4
    assert [version for _, version in engine.updates] == [1, 2]


@pytest.mark.parametrize(
    ("rows", "trainer", "named"),
    [
        (6, fake_trainer(), "per_device_train_batch_size"),
        (4, fake_trainer(generations=4), "num_generations"),
        (4, fake_trainer(temperature=0.7), "temperature"),
        (4, fake_trainer(top_k=20), "top_k"),
    ],
)
def test_a_round_the_batch_does_not_fit_is_refused_before_any_rollout(
    client: RolloutClient, rows: int, trainer: Any, named: str
) -> None:
    with source_of(client, ["a", "b"]) as source:
        func = step_rollout_func(client, source, sync_weights=False)
        with pytest.raises(ConfigError, match=named) as refused:
            func(["x"] * rows, trainer)
    assert refused.value.param == named
    assert list(client.store.records()) == []


def test_an_eval_round_is_refused(client: RolloutClient) -> None:
    trainer = fake_trainer()
    trainer.model.eval()
    source = source_of(client, ["a", "b"])
    with source, pytest.raises(ConfigError, match="training rounds only"):
        step_rollout_func(client, source, sync_weights=False)(["x"] * 4, trainer)
