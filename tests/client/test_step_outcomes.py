"""What a step source hands a trainer, whatever the rollouts did: a step of only flat groups
is handed empty (training goes on), a sample without a reward of its own (a timeout, a failed
reward) is refilled or handed with its reason as the trainer chose, and an agent that cancels
its own task is an agent error, never a cancel to refill."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollway.agents import RolloutContext
from rollway.errors import ConfigError
from rollway.results import AgentResult
from rollway.trajectory import Trajectory
from tests.client.test_step_source import MakeClient, StepAgent, make_client, task_ids

__all__ = ["make_client"]  # the fixture, imported to be found


class OddAgent(StepAgent):
    """``StepAgent``, whose first attempt of sample 0 of a ``hang`` task hangs past the
    rollout's timeout, and whose ``self_cancel`` task cancels its own task after its call."""

    name = "odd-agent"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        if ctx.task.get("hang") and ctx.rollout_id.endswith(".0.1"):
            await asyncio.sleep(30)
        if ctx.task.get("self_cancel"):
            await ctx.chat([{"role": "user", "content": "hi"}])
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(5)
        return await super().run(ctx)


def parity(task: dict[str, Any], trajectory: Trajectory) -> float:
    """The sample's parity (an informative group); the first attempt of sample 0 of a
    ``judged`` task fails every try, as a judge whose engine is down."""
    if task.get("judged") and trajectory.rollout_id.endswith(".0.1"):
        raise ConnectionError("the judge's engine is down")
    return float(int(trajectory.rollout_id.rsplit(".", 2)[-2]) % 2)


@pytest.mark.timeout(60)
def test_a_step_of_only_flat_groups_is_handed_empty_and_training_goes_on(
    make_client: MakeClient, tmp_path: Path
) -> None:
    # B + max_extra_groups = 4 flat groups first (the start of training): step 0 lacks all.
    client = make_client()
    tasks = [*({"task_id": f"flat{i}", "flat": True} for i in range(4)),
             *({"task_id": f"good{i}"} for i in range(16))]  # fmt: skip
    with client.step_source(tasks, group_size=2, groups_per_step=2) as source:
        batches = list(source)
    first = batches[0]
    assert (first.step, len(first), first.lacking) == (0, 0, 2)
    assert first.metrics.set_aside_flat == 4
    handed = [t for b in batches for t in task_ids(b)]
    assert sorted(handed) == sorted(f"good{i}" for i in range(16))
    assert [b.step for b in batches] == list(range(9)) and all(b.lacking == 0 for b in batches[1:])
    assert (tmp_path / "runs" / "steps" / "steps.json").is_file()


@pytest.mark.timeout(60)
def test_flat_groups_at_the_end_of_the_tasks_end_the_iteration_without_an_empty_batch(
    make_client: MakeClient,
) -> None:
    client = make_client()
    tasks = [{"task_id": "good0"}, {"task_id": "good1"},
             *({"task_id": f"flat{i}", "flat": True} for i in range(4))]  # fmt: skip
    with client.step_source(iter(tasks), group_size=2, groups_per_step=2) as source:
        batches = list(source)
    assert [sorted(task_ids(b)) for b in batches] == [["good0", "good1"]]


@pytest.mark.timeout(60)
def test_a_timeout_or_a_failed_reward_is_refilled_by_default_never_handed_unscored(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = make_client(agent=OddAgent, reward=parity, timeout=1.0)
    tasks = [{"task_id": "hung", "hang": True}, {"task_id": "judge", "judged": True}]
    with client.step_source(tasks, group_size=2, groups_per_step=2) as source:
        batch = source.next_batch()
    assert sorted(task_ids(batch)) == ["hung", "judge"]
    assert {r.status for r in batch.records} == {"completed"}
    assert all(r.reward is not None for r in batch.records)
    assert batch.metrics.refilled == {"timeout": 1, "reward": 1}
    reasons = sorted(f["reason"] for f in batch.metrics.failures)
    assert reasons[0].startswith("reward: reward function raised ConnectionError: the judge")
    assert reasons[1].startswith("timeout: timed out after 1 s")


@pytest.mark.timeout(60)
def test_with_unscored_hand_a_timeout_and_a_failed_reward_are_handed_with_their_reason(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = make_client(agent=OddAgent, reward=parity, timeout=1.0)
    tasks = [{"task_id": "hung", "hang": True}, {"task_id": "judge", "judged": True}]
    with client.step_source(tasks, group_size=2, groups_per_step=2, unscored="hand") as source:
        batch = source.next_batch()
    unscored = sorted((r.status, r.error_kind) for r in batch.records if r.reward is None)
    assert unscored == [("error", "reward"), ("timeout", None)]
    assert all(r.reason for r in batch.records if r.reward is None)
    assert batch.metrics.refilled == {}
    with pytest.raises(ConfigError, match="unscored must be one of refill, hand, not 'drop'"):
        client.step_source(tasks, group_size=2, groups_per_step=1, unscored="drop")


@pytest.mark.timeout(60)
def test_an_agent_that_cancels_its_own_task_is_an_agent_error_never_refilled(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = make_client(agent=OddAgent)
    tasks = [{"task_id": "rogue", "self_cancel": True}, {"task_id": "calm"}]
    with client.step_source(tasks, group_size=2, groups_per_step=1) as source:
        batch = source.next_batch()
    assert task_ids(batch) == ["calm"] and batch.metrics.set_aside_failed == 1
    assert batch.metrics.refilled == {}
    failures = batch.metrics.failures
    assert sorted(f["sample"] for f in failures) == [0, 1]
    assert all(not f["refilled"] and f["reason"].startswith("agent: ") for f in failures)
    assert all("cancelled its own task" in f["reason"] for f in failures)
    record = client.store.get("rogue-0.0")  # the group of the task at position 0
    assert record is not None and (record.status, record.error_kind) == ("error", "agent")
    with client.step_source(
        [{"task_id": "rogue2", "self_cancel": True}], group_size=1, groups_per_step=1,
        unscored="hand", dynamic_sampling=False,
    ) as source:  # fmt: skip
        [handed] = source.next_batch().records
    assert (handed.status, handed.error_kind) == ("error", "agent")
    assert "cancelled its own task" in (handed.reason or "")
