"""A training loop drives weights through the client: updates mid-batch lose no rollout and fail
none, every record says which policy sampled it, ``max_staleness`` restarts what falls behind,
and on the embedded model the logprobs after an update are the new model's."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import RolloutRecord
from tests.agents.server.fixtures import wait_until
from tests.client.conftest import ScriptedAgent
from tests.gateway.test_invariants import forward_logprobs

MakeClient = Callable[..., RolloutClient]


def requests_in_flight(client: RolloutClient) -> int:
    """The engine requests in flight at the client's gateway, read from this thread while the
    client's loop runs."""
    try:
        return client.gateway.gateway.requests_in_flight()
    except RuntimeError:  # the loop registered a rollout meanwhile: read again
        return -1


def run_while(client: RolloutClient, tasks: list[dict], action: Callable[[], object]) -> list:
    """Run a batch on a thread and ``action`` (an update) on this one once every task's first
    turn is in the engine."""
    records: list[RolloutRecord] = []
    batch = threading.Thread(
        target=lambda: records.extend(i.result for i in client.run_batch(tasks))
    )
    batch.start()
    wait_until(lambda: requests_in_flight(client) == len(tasks), timeout=30)
    answer = action()
    batch.join(60)
    assert not batch.is_alive()
    return [records, answer]


@pytest.mark.timeout(60)
def test_an_update_mid_batch_fails_no_rollout_and_stamps_the_new_version(
    make_client: MakeClient,
) -> None:
    client = make_client(SimConfig(latency_s=0.6, output_len=4), max_concurrent=8)
    assert client.policy_version == 0
    tasks = [{"task_id": f"t{i}", "chats": 2} for i in range(6)]
    records, update = run_while(client, tasks, lambda: client.update_weights("ckpt-1"))
    assert update["policy_version"] == 1 == client.policy_version
    assert len(records) == 6 and {r.status for r in records} == {"completed"}
    assert all(r.attempts == 1 for r in records)  # an aborted turn is not a failed rollout
    turns = [t for r in records for t in r.trajectory.turns]
    assert sum(t.reissued for t in turns) == 6  # each first turn was in flight, sent again
    assert all(t.policy_versions == [1] * 4 for t in turns)
    assert {r.policy_version for r in records} == {1}


@pytest.mark.timeout(60)
def test_updates_faster_than_the_turns_fail_no_rollout(make_client: MakeClient) -> None:
    # Abort-mode updates every 0.2 s, turns of 0.8 s, the defaults: each turn is aborted at
    # most twice, then finishes on the weights it started with; no turn fails for an update.
    client = make_client(SimConfig(latency_s=0.8, output_len=4), max_concurrent=8)
    records: list[RolloutRecord] = []
    tasks = [{"task_id": f"f{i}", "chats": 2} for i in range(4)]
    batch = threading.Thread(
        target=lambda: records.extend(i.result for i in client.run_batch(tasks))
    )
    batch.start()
    made = 0
    while batch.is_alive() and made < 40:  # bounded: before the fix, turns failed after 17
        time.sleep(0.2)  # the trainer's pace, not a synchronisation
        client.update_weights(f"ckpt-{made}")
        made += 1
    batch.join(60)
    assert len(records) == 4 and {r.status for r in records} == {"completed"}
    assert all(r.attempts == 1 for r in records)
    turns = [t for r in records for t in r.trajectory.turns]
    assert len(turns) == 8 and max(t.reissued for t in turns) == 2
    assert all(t.reissued <= 2 and len(set(t.policy_versions or [])) == 1 for t in turns)
    assert all(r.trajectory.engine_errors == [] for r in records)


@pytest.mark.timeout(60)
def test_drain_keeps_the_old_version_on_the_turns_it_let_finish(make_client: MakeClient) -> None:
    client = make_client(SimConfig(latency_s=0.6, output_len=4), max_concurrent=8)
    tasks = [{"task_id": f"t{i}", "chats": 2} for i in range(4)]
    records, _ = run_while(client, tasks, lambda: client.update_weights("c", mode="drain"))
    for record in records:
        first, second = record.trajectory.turns
        assert (first.policy_versions, second.policy_versions) == ([0] * 4, [1] * 4)
        assert record.policy_version == 0 and first.reissued == second.reissued == 0
        sample = record.trajectory.samples[0]
        assert {v for v, m in zip(sample.policy_versions, sample.loss_mask, strict=True) if m} == {
            0,
            1,
        }


@pytest.mark.timeout(60)
def test_max_staleness_restarts_what_an_update_leaves_too_far_behind(
    make_client: MakeClient,
) -> None:
    client = make_client(SimConfig(latency_s=0.6, output_len=4), max_staleness=0)
    tasks = [{"task_id": f"s{i}", "chats": 2} for i in range(3)]
    records, update = run_while(client, tasks, lambda: client.update_weights("c", mode="drain"))
    assert update["stale_restarts"] == 3 and client.policy.restarts == 3
    for record in records:
        assert record.status == "completed" and record.attempts == 2
        assert record.policy_version == 1  # every token from the new weights
        assert all(t.policy_versions == [1] * 4 for t in record.trajectory.turns)


@pytest.mark.timeout(60)
def test_max_staleness_one_lets_a_rollout_span_one_update_but_not_two(
    make_client: MakeClient,
) -> None:
    client = make_client(SimConfig(latency_s=0.5, output_len=2), max_staleness=1)

    def two_updates() -> list[dict]:
        first = client.update_weights("a", mode="drain")
        second = client.update_weights("b", mode="drain")
        return [first, second]

    tasks = [{"task_id": "long", "chats": 4}]
    (record,), (first, second) = run_while(client, tasks, two_updates)
    assert (first["stale_restarts"], second["stale_restarts"]) == (0, 1)
    assert record.attempts == 2 and record.policy_version == 2
    assert client.update_weights("c")["policy_version"] == 3


def test_a_bad_version_is_refused_and_starts_go_on(make_client: MakeClient) -> None:
    from rollway.errors import InvalidFieldsError

    client = make_client(SimConfig())
    client.update_weights("a", 4)
    with pytest.raises(InvalidFieldsError, match="version 3 does not follow"):
        client.update_weights("b", 3)
    record = client.invoke({"task_id": "after"}).result(timeout=30)
    assert record.status == "completed" and record.policy_version == 4


def perturbed(engine: EmbeddedEngine) -> dict[str, torch.Tensor]:
    """The model's weights with one MLP projection moved enough to change every logprob."""
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    name = next(k for k in state if k.endswith("layers.29.mlp.down_proj.weight"))
    generator = torch.Generator().manual_seed(0)
    state[name] += 0.05 * torch.randn(state[name].shape, generator=generator).to(state[name])
    return state


@pytest.mark.slow  # the embedded model, loaded by the test itself
@pytest.mark.timeout(300)
def test_after_an_update_the_recorded_logprobs_are_the_new_models(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    engine = EmbeddedEngine.from_pretrained(max_batch_size=4)  # its own: weights change here
    gateway = Gateway(engine, renderer, model_name="smol")
    client = RolloutClient(
        ScriptedAgent, gateway, store=str(tmp_path / "runs"), max_tokens=8, temperature=1.0
    )
    try:
        before = client.invoke({"task_id": "b", "q": "Name a colour."}).result(timeout=120)
        old = {k: v.clone() for k, v in engine.model.state_dict().items()}
        client.update_weights(perturbed(engine))
        after = client.invoke({"task_id": "a", "q": "Name a colour."}).result(timeout=120)
        (turn,) = after.trajectory.turns
        assert turn.policy_versions == [1] * len(turn.completion_ids) and after.policy_version == 1
        # Sampled at temperature 1 without a seed: the answer may end before max_tokens.
        (first,) = before.trajectory.turns
        assert first.completion_ids and first.policy_versions == [0] * len(first.completion_ids)
        prompt = after.trajectory.prompt_ids(0)
        ids = prompt + turn.completion_ids
        fresh = forward_logprobs(engine, ids)
        positions = range(len(prompt) - 1, len(ids) - 1)
        expected = [fresh[p, ids[p + 1]].item() for p in positions]
        assert turn.logprobs == pytest.approx(expected, abs=1e-3)
        engine.model.load_state_dict(old)
        stale = forward_logprobs(engine, ids)
        old_lps = [stale[p, ids[p + 1]].item() for p in positions]
        assert max(abs(a - b) for a, b in zip(turn.logprobs, old_lps, strict=True)) > 1e-2
    finally:
        client.close()
        asyncio.run(engine.close())


@pytest.mark.timeout(60)
def test_max_staleness_follows_updates_made_around_the_client(make_client: MakeClient) -> None:
    # A trainer that updates the gateway directly (POST /admin/weights does this) still gets
    # the staleness bound: the client follows the engine's version.
    client = make_client(SimConfig(latency_s=1.5, output_len=2), max_staleness=0)
    engine = client.gateway.gateway.engine

    def update_behind_the_clients_back() -> None:
        client._loop.call(client.gateway.gateway.weights.update("elsewhere", mode="drain"))

    (record,), _ = run_while(client, [{"task_id": "x", "chats": 2}], update_behind_the_clients_back)
    assert engine.policy_version == 1 == client.policy_version
    assert record.attempts == 2 and record.policy_version == 1


def test_a_closed_client_refuses_an_update(make_client: MakeClient) -> None:
    client = make_client(SimConfig())
    client.close()
    with pytest.raises(ConfigError, match="closed"):
        client.update_weights("a")


@pytest.mark.timeout(60)
def test_a_trainer_in_an_event_loop_awaits_an_update_that_leaves_its_loop_free(
    make_client: MakeClient,
) -> None:
    client = make_client(SimConfig(output_len=2))
    ticks: list[int] = []

    async def ticking() -> None:  # the trainer's own loop work while the update runs
        while True:
            ticks.append(len(ticks))
            await asyncio.sleep(0)

    async def trainer_step() -> tuple[dict, RolloutRecord]:
        beside = asyncio.ensure_future(ticking())
        try:
            update = await client.update_weights_async("ckpt-1")
        finally:
            beside.cancel()
        return update, await client.invoke_async({"task_id": "after"})

    update, record = asyncio.run(trainer_step())
    assert update["policy_version"] == 1 == client.policy_version
    assert record.status == "completed" and record.policy_version == 1
    assert ticks  # the loop ran on while it waited
    client.close()
    with pytest.raises(ConfigError, match="closed"):
        asyncio.run(client.update_weights_async("ckpt-2"))


@pytest.mark.timeout(60)
def test_a_batch_after_an_update_samples_anew_from_this_client_and_a_new_one(
    make_client: MakeClient,
) -> None:
    """The loop of docs/training.md as written (resume is on by default): run_batch,
    update_weights, run_batch on the same tasks gets fresh rollouts of the new version."""
    tasks = [{"task_id": f"t{i}"} for i in range(3)]
    client = make_client(SimConfig(output_len=2), exp_id="loop")
    first = {i.result.rollout_key: i.result for i in client.run_batch(tasks, group_size=2)}
    assert {r.policy_version for r in first.values()} == {0}
    client.update_weights("ckpt-1")
    second = [i.result for i in client.run_batch(tasks, group_size=2)]
    assert len(second) == 6 and {r.policy_version for r in second} == {1}
    for record in second:
        old = first[record.rollout_key]
        assert record.run_id != old.run_id and record.started_at > old.started_at
    summary = client.last_summary
    assert summary is not None and summary["resumed"] == 0
    assert summary["rerun"] == {"sampled by policy version 0 (now 1)": 6}
    # The same version and settings again: resume returns what version 1 made.
    assert all(i.from_store for i in client.run_batch(tasks, group_size=2))
    client.close()
    # A new process (a new client, its engine back at version 0) on the same results.
    fresh = make_client(SimConfig(output_len=2), exp_id="loop")
    assert not any(i.from_store for i in fresh.run_batch(tasks[:1]))  # version 0 again: anew
    fresh.update_weights("ckpt-1")
    assert all(i.from_store for i in fresh.run_batch(tasks[1:], group_size=2))
    fresh.update_weights("ckpt-2")
    third = list(fresh.run_batch(tasks, group_size=2))
    assert not any(i.from_store for i in third)
    assert {i.result.policy_version for i in third} == {2}
