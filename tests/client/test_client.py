"""Client semantics over the simulated engine (fast, deterministic)."""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollway import Rubric
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import AgentError, ConfigError, EngineError, InvalidFieldsError
from rollway.gateway import Gateway
from rollway.generation import SamplingParams
from rollway.trajectory import Trajectory
from tests.agents.server.fixtures import wait_until
from tests.client.conftest import ScriptedAgent

MakeClient = Callable[..., RolloutClient]


def test_every_task_times_group_size_yields_exactly_one_outcome(make_client: MakeClient) -> None:
    ends = ["complete", "raise", "error", "none", "complete"]
    tasks = [{"task_id": f"t{i}", "end": end, "reward": 0.5} for i, end in enumerate(ends)]
    items = list(make_client().run_batch(tasks, group_size=3))
    assert len(items) == 15 and sorted(i.index for i in items) == list(range(15))
    by_task = Counter(i.result.task_index for i in items)
    assert set(by_task.values()) == {3}
    first_group = [i.result for i in items if i.result.task_index == 0]
    assert len({r.group_id for r in first_group}) == 1
    assert sorted(r.sample_index for r in first_group) == [0, 1, 2]
    assert len({i.result.group_id for i in items}) == 5
    status = {i.result.task_index: (i.result.status, i.result.error_kind) for i in items}
    assert status == {
        0: ("completed", None),
        1: ("error", "agent"),
        2: ("error", "agent"),
        3: ("error", "agent"),
        4: ("completed", None),
    }
    failed = next(i for i in items if i.result.task_index == 1)
    assert not failed.success and "agent bug" in failed.error
    assert next(i for i in items if i.result.task_index == 3).result.reason.startswith(
        "run returned"
    )


def test_items_arrive_in_completion_order(make_client: MakeClient) -> None:
    tasks = [{"task_id": f"w{i}", "wait": w} for i, w in enumerate([0.6, 0.0, 0.3])]
    items = list(make_client().run_batch(tasks))
    assert [i.index for i in items] == [1, 2, 0]
    assert items[-1].elapsed >= 0.6


def test_concurrency_never_exceeds_the_cap(make_client: MakeClient) -> None:
    tasks = [{"task_id": f"c{i}", "wait": 0.05} for i in range(12)]
    list(make_client(max_concurrent=3).run_batch(tasks))
    assert ScriptedAgent.peak == 3


def test_rate_limit_holds_rollout_starts(make_client: MakeClient) -> None:
    list(make_client(tps_limit=5).run_batch([{"task_id": f"r{i}"} for i in range(12)]))
    starts = sorted(ScriptedAgent.starts)
    # Slowness can only spread starts further apart; a broken limiter packs them together.
    most_in_a_second = max(sum(1 for s in starts if t <= s < t + 1.0) for t in starts)
    assert most_in_a_second <= 6
    assert starts[-1] - starts[0] >= 1.0


def test_timeout_aborts_generation_and_is_recorded(make_client: MakeClient) -> None:
    client = make_client(sim=SimConfig(latency_s=60.0), timeout=0.3)
    (item,) = client.run_batch([{"task_id": "slow"}])
    record = item.result
    assert record.status == "timeout" and "0.3" in record.reason
    assert record.trajectory.turns[0].finish_reason == "abort"
    assert record.trajectory.is_cancelled  # the timeout's abort cut a generation short
    assert client.gateway.gateway.engine._running == {}


def test_a_timeout_says_where_the_time_went(make_client: MakeClient) -> None:
    """On a busy engine, in the agent: the record's reason (what the Python API shows) says
    which, never a bare timeout."""
    client = make_client(sim=SimConfig(latency_s=60.0), timeout=0.5, max_concurrent=3)
    tasks = [{"task_id": f"e{i}"} for i in range(3)] + [{"task_id": "a", "wait": 60}]
    records = {i.result.rollout_key: i.result for i in client.run_batch(tasks)}
    assert {r.status for r in records.values()} == {"timeout"}
    engine = records["e0.0"].reason or ""
    assert engine.startswith("timed out after 0.5 s (no turn finished); its model call waited")
    # Each snapshot is taken as its own time runs out: the others' calls may be aborted by then.
    assert re.search(r"waited 0\.\d s for the engine, with [123] model calls in flight", engine)
    assert "lower max_concurrent or raise timeout" in engine
    agent = records["a.0"].reason or ""
    assert agent.startswith("timed out after 0.5 s (no turn finished); no model call was pending")
    assert "the agent itself took the time" in agent


def test_cancel_ends_a_rollout_with_a_cancelled_record(make_client: MakeClient) -> None:
    client = make_client(sim=SimConfig(latency_s=60.0))
    future = client.invoke({"task_id": "hang"})
    assert not future.done()
    assert future.cancel() is True
    record = future.result(timeout=10)
    assert record.status == "cancelled" and future.cancelled and future.done()
    assert future.cancel() is False and future.elapsed() < 10
    assert client.gateway.gateway.engine._running == {}


def test_a_hanging_or_raising_agent_costs_only_its_own_rollout(make_client: MakeClient) -> None:
    client = make_client(timeout=0.5)
    tasks = [{"task_id": "hang", "wait": 60}, {"task_id": "bug", "end": "raise"}]
    tasks += [{"task_id": f"ok{i}", "reward": 1.0} for i in range(4)]
    results = {i.result.task["task_id"]: i.result for i in client.run_batch(tasks)}
    assert results["hang"].status == "timeout" and results["bug"].error_kind == "agent"
    assert all(results[f"ok{i}"].status == "completed" for i in range(4))
    # The client's cancel at cleanup (nothing in flight) does not mark a finished rollout.
    assert not any(results[f"ok{i}"].trajectory.is_cancelled for i in range(4))


def test_infrastructure_failures_are_retried_and_others_are_not(make_client: MakeClient) -> None:
    tasks = [
        {"task_id": "flaky", "end": "flaky", "reward": 1.0},
        {"task_id": "bug", "end": "raise"},
    ]
    results = {i.result.task["task_id"]: i.result for i in make_client().run_batch(tasks)}
    assert results["flaky"].status == "completed" and results["flaky"].attempts == 2
    assert results["bug"].attempts == 1


def test_engine_failures_are_engine_errors_retried_and_rerun(
    make_client: MakeClient, renderer
) -> None:
    """An engine failure says nothing about the policy: the rollout is run again (a new
    attempt) and a resume reruns what is still failed; the trajectory names the failure."""
    failures = {"left": 1}

    class BrokenEngine(SimEngine):
        async def generate(self, input_ids: list[int], sampling: SamplingParams, request_id: str):
            if failures["left"] != 0:
                failures["left"] -= 1
                raise EngineError("GPU fell off")
            return await super().generate(input_ids, sampling, request_id)

    def client_over(engine: SimEngine) -> RolloutClient:
        return RolloutClient(
            ScriptedAgent, Gateway(engine, renderer, model_name="x"),
            store=str(make_client().store.path.parent), exp_id="broken", max_retry_attempts=2,
        )  # fmt: skip

    with client_over(BrokenEngine()) as client:  # fails once: the second attempt completes
        (item,) = client.run_batch([{"task_id": "flaky"}])
    assert (item.result.status, item.result.attempts) == ("completed", 2)
    failures["left"] = -1  # fails for good
    with client_over(BrokenEngine()) as client:
        (item,) = client.run_batch([{"task_id": "e"}])
    record = item.result
    assert (record.status, record.error_kind, record.attempts) == ("error", "engine", 2)
    assert "GPU fell off" in record.reason
    assert record.trajectory.engine_errors == ["GPU fell off"]
    failures["left"] = 0  # the engine is back: a resume reruns the failed rollout
    with client_over(BrokenEngine()) as client:
        (item,) = client.run_batch([{"task_id": "e"}])
    assert item.result.status == "completed" and not item.result.trajectory.engine_errors


def test_rewards_from_agent_or_function_sync_async_and_dict(make_client: MakeClient) -> None:
    def sync_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
        return float(len(trajectory.turns))

    async def dict_reward(task: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
        return {"reward": 0.25, "why": "async"}

    tasks = [{"task_id": "fn", "chats": 2}, {"task_id": "agent", "reward": 0.75}]
    (item,) = make_client(exp_id="agent-only").run_batch(tasks[1:])
    assert item.result.reward == 0.75 and item.result.reward_info == {"source": "agent"}
    by_id = {
        i.result.task["task_id"]: i.result for i in make_client(reward=sync_reward).run_batch(tasks)
    }
    assert by_id["fn"].reward == 2.0 and by_id["fn"].reward_info == {"source": "reward_fn"}
    # The function given explicitly wins; the agent's own reward is kept beside it.
    assert by_id["agent"].reward == 1.0
    assert by_id["agent"].reward_info == {"source": "reward_fn", "agent_reward": 0.75}
    (item,) = make_client(reward=dict_reward, exp_id="dict").run_batch([{"task_id": "d"}])
    assert item.result.reward == 0.25 and item.result.reward_info["why"] == "async"


def test_a_slow_or_broken_reward_function_fails_only_its_rollout(make_client: MakeClient) -> None:
    async def slow(task: dict[str, Any], trajectory: Trajectory) -> float:
        if task["task_id"] == "slow":
            await asyncio.sleep(60)
        if task["task_id"] == "bad":
            return "high"  # type: ignore[return-value]
        return 1.0

    client = make_client(reward=slow, reward_timeout=0.3)
    tasks = [{"task_id": "slow"}, {"task_id": "bad"}, {"task_id": "fine"}]
    by_id = {i.result.task["task_id"]: i.result for i in client.run_batch(tasks)}
    assert by_id["slow"].error_kind == "reward" and "timed out" in by_id["slow"].reason
    assert by_id["bad"].error_kind == "reward" and "not float" in by_id["bad"].reason
    assert by_id["fine"].reward == 1.0


def test_a_rubric_scores_each_rollout_with_its_components(make_client: MakeClient) -> None:
    def turns(task: dict[str, Any], trajectory: Trajectory) -> float:
        return float(len(trajectory.turns))

    async def asked(task: dict[str, Any], trajectory: Trajectory) -> float:
        return 1.0 if task["task_id"] == "yes" else 0.0

    rubric = Rubric({"turns": turns, "asked": asked}, weights={"turns": 0.5})
    tasks = [{"task_id": "yes", "chats": 2}, {"task_id": "no"}]
    items = make_client(reward=rubric).run_batch(tasks)
    by_id = {i.result.task["task_id"]: i.result for i in items}
    assert by_id["yes"].reward == 2.0 and by_id["no"].reward == 0.5
    assert by_id["yes"].reward_info == {"turns": 2.0, "asked": 1.0, "source": "reward_fn"}


def test_reward_components_show_in_the_summaries_the_table_and_the_export(
    make_client: MakeClient, tmp_path: Path
) -> None:
    import orjson
    import pyarrow.parquet as pq
    from rich.console import Console

    from rollway.client.batch import summarize
    from rollway.client.progress import summary_table
    from rollway.store import export_records

    def checks(task: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
        return {"reward": 1.0, "format": 1.0, "correct": float(task["task_id"] == "a")}

    client = make_client(reward=checks, exp_id="components")
    records = [i.result for i in client.run_batch([{"task_id": "a"}, {"task_id": "b"}], 2)]
    summary = orjson.loads((client.store.path / "summary.json").read_bytes())
    assert summary["reward_components"] == {
        "correct": {"mean": 0.5, "std": 0.5, "n": 4}, "format": {"mean": 1.0, "std": 0.0, "n": 4}
    }  # fmt: skip
    groups = orjson.loads((client.store.path / "groups.json").read_bytes())["groups"]
    assert [g["reward_components"]["correct"]["mean"] for g in groups] == [1.0, 0.0]
    console = Console(width=100, record=True)
    console.print(summary_table(summarize(records, 1.0)))
    table = console.export_text()
    assert "reward/correct" in table and "0.500 ± 0.500" in table
    out = tmp_path / "rows.parquet"
    export_records(client.store.records(), out, "parquet")
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["reward/correct"] for r in rows) == [0.0, 0.0, 1.0, 1.0]
    assert {r["reward/format"] for r in rows} == {1.0}


def test_a_flaky_grader_is_retried_until_every_rollout_is_scored(make_client: MakeClient) -> None:
    tries: Counter[str] = Counter()

    def flaky(task: dict[str, Any], trajectory: Trajectory) -> float:
        tries[task["task_id"]] += 1  # fails 30% of its tries, the same ones on every run
        if random.Random(f"7:{task['task_id']}:{tries[task['task_id']]}").random() < 0.3:
            raise ConnectionError("grader unreachable")
        return 1.0

    tasks = [{"task_id": f"f{i}"} for i in range(16)]
    records = [i.result for i in make_client(reward=flaky).run_batch(tasks)]
    assert [r.status for r in records] == ["completed"] * 16
    assert all(r.reward == 1.0 for r in records)
    retried = [r for r in records if "tries" in r.reward_info]
    assert retried and sum(tries.values()) > 16  # some tries failed, and were tried again
    for record in retried:  # each try is recorded: the failed ones with their error
        *failed, last = record.reward_info["tries"]
        assert all("ConnectionError: grader unreachable" in t["error"] for t in failed)
        assert "error" not in last and last["elapsed_s"] >= 0
        assert len(failed) + 1 == tries[record.task["task_id"]]


def test_a_grader_that_fails_every_try_keeps_the_trajectory(make_client: MakeClient) -> None:
    def broken(task: dict[str, Any], trajectory: Trajectory) -> float:
        raise ConnectionError("grader down")

    (item,) = make_client(reward=broken).run_batch([{"task_id": "down", "chats": 2}])
    record = item.result
    assert (record.status, record.error_kind, record.reward) == ("error", "reward", None)
    assert record.reason == "reward function raised ConnectionError: grader down (3 tries)"
    assert [t["error"] for t in record.reward_info["tries"]] == [
        "reward function raised ConnectionError: grader down"
    ] * 3  # reward_retries=2 by default: 3 tries
    assert record.trajectory is not None and len(record.trajectory.turns) == 2
    stored = make_client().store.get(record.rollout_key)
    assert stored is not None and stored.trajectory == record.trajectory


def test_group_statistics_leave_out_infrastructure_failures(make_client: MakeClient) -> None:
    from rollway.client.batch import group_stats

    client = make_client(max_retry_attempts=1)
    tasks = [{"task_id": "g", "end": "flaky", "reward": 1.0}]
    records = [i.result for i in client.run_batch(tasks, group_size=2)]
    (stats,) = group_stats(records)
    assert stats.infrastructure_failures == 2 and stats.rewards == [] and stats.mean is None
    groups = client.store.path / "groups.json"
    assert '"infrastructure_failures": 2' in groups.read_text()


def test_resume_skips_finished_rollouts_and_reruns_the_rest(make_client: MakeClient) -> None:
    tasks = [{"task_id": f"s{i}", "reward": 1.0} for i in range(3)]
    first = list(make_client(exp_id="resume").run_batch(tasks, group_size=2))
    assert len(ScriptedAgent.starts) == 6 and not any(i.from_store for i in first)
    client = make_client(exp_id="resume")
    stored = client.store.get("s0.1")
    client.store.write(stored.model_copy(update={"status": "cancelled"}))
    (client.store.path / "trajectories" / "s2.0.json").unlink()
    ScriptedAgent.starts = []
    second = list(client.run_batch(tasks, group_size=2))
    assert len(second) == 6 and len(ScriptedAgent.starts) == 2
    rerun = sorted(i.result.rollout_key for i in second if not i.from_store)
    assert rerun == ["s0.1", "s2.0"]


def test_resume_reruns_what_other_settings_made_and_says_why(make_client: MakeClient) -> None:
    tasks = [{"task_id": f"s{i}"} for i in range(2)]
    first = list(make_client(exp_id="settings", timeout=5.0).run_batch(tasks))
    assert all(i.result.fingerprint is not None for i in first)
    client = make_client(exp_id="settings", timeout=10.0)  # a longer timeout: other outcomes
    second = list(client.run_batch(tasks))
    assert not any(i.from_store for i in second)
    assert client.last_summary is not None
    assert client.last_summary["rerun"] == {"settings changed: limits.timeout 5.0 (now 10.0)": 2}
    assert all(i.result.fingerprint["limits"]["timeout"] == 10.0 for i in second)  # type: ignore[index]
    assert all(i.from_store for i in client.run_batch(tasks))  # the same settings: resumed


def test_resume_reruns_a_record_without_a_fingerprint(make_client: MakeClient) -> None:
    tasks = [{"task_id": "old"}, {"task_id": "new"}]
    client = make_client(exp_id="old")
    list(client.run_batch(tasks))
    old = client.store.get("old.0")
    assert old is not None
    client.store.write(old.model_copy(update={"fingerprint": None}))  # made by an older rollway
    again = {i.result.rollout_key: i for i in client.run_batch(tasks)}
    assert not again["old.0"].from_store and again["new.0"].from_store
    assert client.last_summary is not None
    assert client.last_summary["rerun"] == {"no fingerprint (recorded by an older rollway)": 1}


def test_futures_can_be_awaited_polled_and_waited_on(make_client: MakeClient) -> None:
    client = make_client()
    future = client.invoke({"task_id": "f", "reward": 1.0}, temperature=0.5)
    record = future.result(timeout=30)
    assert future.done() and not future.cancelled and record.reward == 1.0
    assert record.trajectory.turns[0].sampling["temperature"] == 0.5

    async def together() -> list[float | None]:
        a = client.invoke_async({"task_id": "a", "reward": 0.1})
        b = client.invoke({"task_id": "b", "reward": 0.2})
        return [r.reward for r in await asyncio.gather(a, b)]

    assert asyncio.run(together()) == [0.1, 0.2]


async def test_run_batch_async_yields_every_outcome(make_client: MakeClient) -> None:
    client = make_client()
    tasks = [{"task_id": f"a{i}", "wait": 0.01 * (3 - i)} for i in range(3)]
    items = [item async for item in client.run_batch_async(tasks, group_size=2)]
    assert sorted(i.index for i in items) == list(range(6))
    assert all(i.success for i in items)


def test_stopping_iteration_early_cancels_the_rest(make_client: MakeClient) -> None:
    client = make_client(max_concurrent=1)
    tasks = [{"task_id": "first"}] + [{"task_id": f"later{i}", "wait": 60} for i in range(3)]
    batch = client.run_batch(tasks)
    next(batch)
    batch.close()
    statuses = sorted(r.status for r in client.store.records())
    assert statuses == ["cancelled", "cancelled", "cancelled", "completed"]


def test_bad_configuration_fails_before_any_rollout(make_client: MakeClient) -> None:
    with pytest.raises(ConfigError, match="unknown option 'temprature': did you mean 'temp"):
        make_client(temprature=1.0)

    class NoRun(ScriptedAgent):
        name = "norun"
        run = None  # type: ignore[assignment]

    with pytest.raises(AgentError, match=r"RUN_NOT_ASYNC \(run\)"):
        make_client(agent=NoRun)


def test_debug_events_go_to_a_per_rollout_jsonl(make_client: MakeClient) -> None:
    client = make_client(debug=True)
    (item,) = client.run_batch([{"task_id": "dbg", "chats": 2}])
    lines = (client.store.path / "debug" / f"{item.result.rollout_id}.jsonl").read_text()
    kinds = [line.split('"kind":"')[1].split('"')[0] for line in lines.splitlines()]
    assert kinds == ["chat", "chat", "complete"]


def test_task_row_metadata_reaches_the_trajectory(make_client: MakeClient) -> None:
    (item,) = make_client().run_batch([{"task_id": "meta", "source": "unit", "difficulty": 3}])
    metadata = item.result.trajectory.metadata
    assert metadata["source"] == "unit" and metadata["difficulty"] == 3
    assert metadata["group_id"] == item.result.group_id and metadata["sample_index"] == 0


def test_a_seeded_run_gives_each_rollout_and_turn_its_own_seed(make_client: MakeClient) -> None:
    client = make_client(seed=7)
    items = list(client.run_batch([{"task_id": "s", "chats": 2}], group_size=2))
    seeds = [[t.sampling["seed"] for t in i.result.trajectory.turns] for i in items]
    (a0, a1), (b0, b1) = seeds
    assert a0 != b0 and a1 == a0 + 1 and b1 == b0 + 1
    again = make_client(seed=7, exp_id="again").run_batch([{"task_id": "s", "chats": 2}], 2)
    assert sorted(seeds) == sorted(
        [[t.sampling["seed"] for t in i.result.trajectory.turns] for i in again]
    )


def test_rollouts_cancelled_while_queued_register_and_generate_nothing(
    renderer, tmp_path: Path
) -> None:
    registered: list[str] = []
    generations: list[str] = []

    class Counting(Gateway):
        def register(self, rollout_id: str, request: Any, *, reuse: bool = False):
            registered.append(rollout_id)
            return super().register(rollout_id, request, reuse=reuse)

    class CountingEngine(SimEngine):
        async def generate(self, input_ids: list[int], sampling: SamplingParams, request_id: str):
            generations.append(request_id)
            return await super().generate(input_ids, sampling, request_id)

    engine = CountingEngine(SimConfig(latency_s=60.0))
    gateway = Counting(engine, renderer, model_name="sim")
    with RolloutClient(ScriptedAgent, gateway, store=str(tmp_path), max_concurrent=2) as client:
        futures = [client.invoke({"task_id": f"q{i}"}) for i in range(6)]
        wait_until(lambda: len(engine._running) == 2)
        running, queued = futures[:2], futures[2:]
        for future in queued:
            future.cancel()
        # Resolved at once, while both slots are still held by running rollouts.
        records = [future.result(timeout=5) for future in queued]
        assert not any(future.done() for future in running)
        for future in running:
            future.cancel()
        records += [future.result(timeout=10) for future in running]
    assert [r.status for r in records] == ["cancelled"] * 6
    assert {r.reason for r in records[:4]} == {"cancelled before it started"}
    assert all(r.attempts == 1 and r.trajectory is None for r in records[:4])
    assert len(registered) == 2 and len(generations) == 2
    assert len(ScriptedAgent.starts) == 2


@pytest.mark.parametrize(
    ("option", "value"), [("timeout", -1.0), ("timeout", 0.0), ("reward_timeout", float("nan"))]
)
def test_a_timeout_that_is_not_positive_fails_at_construction(
    make_client: MakeClient, option: str, value: float
) -> None:
    with pytest.raises(ConfigError, match=f"{option} must be a positive"):
        make_client(**{option: value})


def test_a_temperature_that_is_not_finite_fails_at_construction(make_client: MakeClient) -> None:
    with pytest.raises(InvalidFieldsError, match=r"^temperature: must be a number from 0 to 2"):
        make_client(temperature=float("nan"))
