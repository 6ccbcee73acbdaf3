"""A trainer's step source on the simulated engine: whole groups as soon as B are done, the
rest carried into the next step (never cancelled), flat groups set aside and replaced, samples
lost to the engine refilled in their group, the staleness policies, and a task stream that a
restarted trainer continues where its store says it stopped."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient, StepBatch
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError, EngineError, StoredDataError
from rollway.events import RolloutEvent, StepHandedOver, TurnStarted
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import GenerationResult, SamplingParams
from rollway.results import AgentResult
from tests.restartable import RestartableProcess


class StepAgent(AgentLoop):
    """Waits ``wait`` s, makes one model call, waits ``after`` s (its tokens age meanwhile);
    reward: the sample's parity (an informative group), or 0.5 for every sample (``flat``)."""

    name = "step-agent"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        task = ctx.task
        sample = int(ctx.rollout_id.rsplit(".", 2)[-2])
        await asyncio.sleep(task.get("wait", 0))
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.get("q", "hi")}]
        reply = await ctx.chat(messages)
        await asyncio.sleep(task.get("after", 0))
        reward = 0.5 if task.get("flat") else float(sample % 2)
        return ctx.complete([*messages, reply.message], reward=reward)


class FlakyEngine(SimEngine):
    """Fails the engine call of the attempts whose request id contains one of ``failing``
    (``task.sample.attempt-turn``), as an engine that crashed mid-turn."""

    def __init__(self, failing: set[str]) -> None:
        super().__init__(SimConfig(output_len=4))
        self.failing = failing

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        if any(f".{part}-" in request_id for part in self.failing):
            raise EngineError("the engine crashed mid-turn")
        return await super().generate(input_ids, sampling, request_id)


MakeClient = Callable[..., RolloutClient]


@pytest.fixture
def make_client(renderer: ChatRenderer, tmp_path: Path) -> Iterator[MakeClient]:
    clients: list[RolloutClient] = []

    def make(
        engine: SimEngine | None = None, agent: type[AgentLoop] | None = None, **kwargs: Any
    ) -> RolloutClient:
        gateway = Gateway(engine or SimEngine(SimConfig(output_len=4)), renderer, model_name="sim")
        kwargs.setdefault("store", str(tmp_path / "runs"))
        kwargs.setdefault("exp_id", "steps")
        client = RolloutClient(agent or StepAgent, gateway, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def task_ids(batch: StepBatch) -> list[str]:
    return [group[0].task["task_id"] for group in batch.groups]


@pytest.mark.timeout(60)
def test_a_batch_is_whole_groups_handed_as_they_finish_and_the_rest_goes_on(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rollway.client")
    events: list[RolloutEvent] = []
    client = make_client(on_event=events.append)
    tasks = [
        {"task_id": "fast0"},
        {"task_id": "slow1", "wait": 1.5},
        {"task_id": "fast2"},
        {"task_id": "slow3", "wait": 1.5},
    ]
    with client.step_source(tasks, group_size=2, groups_per_step=2, over_sample=1.0) as source:
        first = source.next_batch()
        # Handed while the slow groups still run: they are carried, not cancelled.
        assert sorted(task_ids(first)) == ["fast0", "fast2"]
        assert source.in_flight == 2 and first.metrics.carried_over == 2
        assert first.lacking == 0 and first.metrics.wait_s < 1.5
        assert all(len(group) == 2 for group in first.groups)
        assert [r.sample_index for g in first.groups for r in g] == [0, 1, 0, 1]
        second = next(source)
        assert sorted(task_ids(second)) == ["slow1", "slow3"]
        assert {r.status for r in [*first.records, *second.records]} == {"completed"}
        assert (first.step, second.step) == (0, 1)
        with pytest.raises(StopIteration):
            source.next_batch()
    handed = [e for e in events if isinstance(e, StepHandedOver)]
    assert [e.step for e in handed] == [0, 1]
    assert handed[0].metrics["groups_used"] == 2 and handed[0].metrics["carried_over"] == 2
    assert handed[0].metrics["staleness"] == {"0": 16}  # 4 samples x 4 tokens, on-policy
    lines = [r.getMessage() for r in caplog.records if getattr(r, "stage", None) == "step"]
    assert any(line.startswith("step 0: 2 groups; set aside 0 flat") for line in lines)
    assert any("2 carried over" in line and "tokens by versions behind: 0: 16" in line
               for line in lines)  # fmt: skip


@pytest.mark.timeout(60)
def test_flat_groups_are_set_aside_and_replaced_until_the_batch_is_informative(
    make_client: MakeClient,
) -> None:
    client = make_client()
    tasks = [
        {"task_id": "flat0", "flat": True},
        {"task_id": "good1"},
        {"task_id": "flat2", "flat": True},
        {"task_id": "good3"},
        {"task_id": "good4"},
    ]
    with client.step_source(tasks, group_size=2, groups_per_step=2) as source:
        batch = source.next_batch()
    assert sorted(task_ids(batch)) == ["good1", "good3"]
    assert batch.metrics.set_aside_flat == 2 and batch.lacking == 0
    assert all(len({r.reward for r in group}) == 2 for group in batch.groups)


@pytest.mark.timeout(60)
def test_past_its_cap_on_extra_groups_a_batch_says_how_many_it_lacks(
    make_client: MakeClient,
) -> None:
    client = make_client()
    tasks = [{"task_id": "flat0", "flat": True}, {"task_id": "good1"}, {"task_id": "good2"}]
    source = client.step_source(tasks, group_size=2, groups_per_step=2, max_extra_groups=0)
    with source:
        batch = source.next_batch()
    assert task_ids(batch) == ["good1"] and batch.lacking == 1 == batch.metrics.lacking
    assert batch.metrics.set_aside_flat == 1


@pytest.mark.timeout(60)
def test_a_sample_lost_to_the_engine_is_refilled_in_its_group_never_handed_over(
    make_client: MakeClient,
) -> None:
    # max_retry_attempts=1: the client does not retry, so the failure reaches the source.
    client = make_client(FlakyEngine({"boom-0.0.1"}), max_retry_attempts=1)
    tasks = [{"task_id": "boom"}, {"task_id": "calm"}]
    with client.step_source(tasks, group_size=2, groups_per_step=2) as source:
        batch = source.next_batch()
    assert sorted(task_ids(batch)) == ["boom", "calm"]
    assert {r.status for r in batch.records} == {"completed"}
    assert all(r.error_kind is None for r in batch.records)
    boom = next(g for g in batch.groups if g[0].task["task_id"] == "boom")
    assert [r.attempts for r in boom] == [2, 1]  # sample 0: a fresh attempt, in its group
    assert batch.metrics.refilled == {"engine": 1}
    [failure] = batch.metrics.failures
    assert failure["sample"] == 0 and failure["refilled"]
    assert "engine" in failure["reason"] and "crashed mid-turn" in failure["reason"]


@pytest.mark.timeout(60)
def test_a_sample_whose_refills_run_out_sets_its_group_aside(make_client: MakeClient) -> None:
    client = make_client(FlakyEngine({"boom-0.0.1"}), max_retry_attempts=1)
    tasks = [{"task_id": "boom"}, {"task_id": "calm"}]
    with client.step_source(tasks, group_size=2, groups_per_step=1, max_refills=0) as source:
        batch = source.next_batch()
    assert task_ids(batch) == ["calm"] and batch.metrics.set_aside_failed == 1
    assert batch.metrics.refilled == {} and not batch.metrics.failures[0]["refilled"]


def stale_step(client: RolloutClient, **kw: Any) -> tuple[StepBatch, StepBatch]:
    """Step 0 hands the fast group; the slow one sampled its tokens under version 0 and is
    still running when the trainer pushes versions 1 and 2; step 1 is what becomes of it."""
    tasks = [{"task_id": "fast"}, {"task_id": "slow", "after": 1.0}]
    with client.step_source(tasks, group_size=2, groups_per_step=1, over_sample=1.0, **kw) as s:
        first = s.next_batch()
        client.update_weights("ckpt-1")
        client.update_weights("ckpt-2")
        return first, s.next_batch()


@pytest.mark.timeout(60)
def test_stale_restart_runs_the_stale_samples_again_under_the_new_weights(
    make_client: MakeClient,
) -> None:
    first, second = stale_step(make_client(), max_staleness=1, stale="restart")
    assert task_ids(first) == ["fast"] and task_ids(second) == ["slow"]
    assert second.metrics.restarted_stale == 2 and second.policy_version == 2
    assert {r.policy_version for r in second.records} == {2}
    assert set(second.metrics.staleness) == {0}


@pytest.mark.timeout(60)
def test_stale_drop_drops_the_group_and_runs_its_task_again(make_client: MakeClient) -> None:
    _, second = stale_step(make_client(), max_staleness=1, stale="drop")
    assert task_ids(second) == ["slow"] and second.metrics.dropped_stale == 1
    assert {r.policy_version for r in second.records} == {2}
    assert second.groups[0][0].group_id == "steps:slow-1-d1"  # a new group of the same task


@pytest.mark.timeout(60)
def test_stale_keep_hands_over_the_tokens_with_their_versions(make_client: MakeClient) -> None:
    _, second = stale_step(make_client(), max_staleness=1, stale="keep")
    assert {r.policy_version for r in second.records} == {0}
    assert second.metrics.staleness == {2: 8}  # 2 samples x 4 tokens, 2 versions behind
    assert second.metrics.restarted_stale == second.metrics.dropped_stale == 0


def test_keep_is_refused_on_a_client_that_restarts_stale_rollouts(
    make_client: MakeClient,
) -> None:
    client = make_client(max_staleness=1)
    with pytest.raises(ConfigError, match="make the client without max_staleness"):
        client.step_source([{"task_id": "a"}], group_size=2, groups_per_step=1, stale="keep")
    with pytest.raises(ConfigError, match="stale must be one of restart, drop, keep"):
        client.step_source([{"task_id": "a"}], group_size=2, groups_per_step=1, stale="later")


@pytest.mark.timeout(60)
def test_a_restarted_trainer_continues_the_task_stream_where_the_store_says(
    make_client: MakeClient,
) -> None:
    tasks = [{"task_id": "t0"}, {"task_id": "t1", "wait": 5.0}, {"task_id": "t2"}]
    client = make_client()
    with client.step_source(tasks, group_size=2, groups_per_step=1, over_sample=1.0) as source:
        assert task_ids(source.next_batch()) == ["t0"]
    client.close()  # t1 was cut short: it is not settled, so it runs again
    tasks[1]["wait"] = 0
    again = make_client()
    with again.step_source(iter(tasks), group_size=2, groups_per_step=1) as source:
        batches = list(source)
    assert [task_ids(batch) for batch in batches] == [["t1"], ["t2"]]
    assert [batch.step for batch in batches] == [1, 2]  # the step count goes on too
    with (
        again.step_source(tasks, group_size=2, groups_per_step=1) as source,
        pytest.raises(StopIteration),
    ):
        source.next_batch()


@pytest.mark.timeout(60)
def test_with_prefetch_the_next_steps_groups_start_at_the_hand_over(
    make_client: MakeClient,
) -> None:
    # Every group of the cap was ready at the hand-over: none in flight, so no completion
    # would start the next ones; the hand-over itself must, or nothing overlaps training.
    client = make_client()
    tasks = [{"task_id": "t0"}, *({"task_id": f"t{i}", "wait": 0.5} for i in (1, 2))]
    with client.step_source(tasks, group_size=2, groups_per_step=1, prefetch=True) as source:
        first = source.next_batch()
        assert first.metrics.carried_over == 0
        assert source.in_flight == 1  # the next step's group runs while the trainer trains
        assert task_ids(source.next_batch()) == ["t1"]


@pytest.mark.timeout(60)
def test_epochs_pass_over_the_tasks_again_and_the_async_form_iterates(
    make_client: MakeClient,
) -> None:
    client = make_client()
    tasks = [{"task_id": "a"}, {"task_id": "b"}]
    source = client.step_source(tasks, group_size=2, groups_per_step=2, epochs=2)

    async def take() -> list[StepBatch]:
        return [batch async for batch in source]

    with source:
        batches = asyncio.run(take())
    assert [sorted(task_ids(b)) for b in batches] == [["a", "b"], ["a", "b"]]
    keys = {r.group_id for b in batches for r in b.records}
    assert keys == {"steps:a-0", "steps:b-1", "steps:a-2", "steps:b-3"}
    with pytest.raises(ConfigError, match="pass list"):
        client.step_source((t for t in tasks), group_size=2, groups_per_step=1, epochs=2)


def test_a_position_file_that_is_not_one_is_named_with_the_fix(
    make_client: MakeClient, tmp_path: Path
) -> None:
    (tmp_path / "runs" / "steps").mkdir(parents=True)
    (tmp_path / "runs" / "steps" / "steps.json").write_text('{"settled_below": "x"}')
    client = make_client()
    with pytest.raises(StoredDataError, match=r"steps summary of experiment steps.*delete the"):
        client.step_source([{"task_id": "a"}], group_size=2, groups_per_step=1)


#: Longer than a rollout's timeout below: the rollouts it cut end as engine errors.
OUTAGE_S = 2.5


@pytest.mark.timeout(180)
def test_an_engine_killed_mid_step_leaves_the_batch_complete_with_refilled_samples(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    engine = RestartableProcess(
        ["sim-server", "--protocol", "vllm", "--port", "{port}", "--latency-s", "0.5",
         "--output-len", "4"]
    )  # fmt: skip
    turns = threading.Event()
    gateway = Gateway(VLLMEngine(engine.url), renderer, model_name="sim")
    client = RolloutClient(
        StepAgent,
        gateway,
        store=str(tmp_path),
        exp_id="killed",
        timeout=1.5,
        max_retry_attempts=1,
        on_event=lambda e: turns.set() if isinstance(e, TurnStarted) else None,
    )
    tasks = [{"task_id": f"t{i}"} for i in range(4)]
    try:
        with (
            client,
            client.step_source(tasks, group_size=2, groups_per_step=4, max_refills=10) as source,
        ):
            outage = threading.Thread(target=kill_and_restart, args=(engine, turns))
            outage.start()
            batch = source.next_batch()
            outage.join(120)
            client._loop.call(gateway.engine.close())  # the client closes no engine it was given
    finally:
        engine.stop()
    assert sorted(task_ids(batch)) == ["t0", "t1", "t2", "t3"] and batch.lacking == 0
    assert {r.status for r in batch.records} == {"completed"}
    assert all(r.error_kind is None for r in batch.records)
    assert batch.metrics.refilled.get("engine", 0) >= 1
    assert all(f"the engine at {engine.url} was down" in f["reason"]
               for f in batch.metrics.failures)  # fmt: skip
    assert any(r.attempts > 1 for r in batch.records)


def kill_and_restart(engine: RestartableProcess, turns: threading.Event) -> None:
    """SIGKILL the engine once turns are in flight; start it again after ``OUTAGE_S``."""
    assert turns.wait(60)
    engine.stop()
    time.sleep(OUTAGE_S)  # the outage's length, not a synchronisation
    engine.start()
