"""The client's ids follow the gateway's id rule: a bad experiment id fails at construction
(not in every rollout's registration), and task ids that could not be part of a rollout id
are hashed."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest

from rollway.client import RolloutClient
from rollway.errors import ConfigError
from rollway.ids import is_safe_id
from rollway.rollouts import task_key


@pytest.mark.parametrize("exp_id", ["my run", "..", "a/b", "h#1", "e" * 101])
def test_an_exp_id_outside_the_rule_fails_at_construction(
    make_client: Callable[..., RolloutClient], exp_id: str
) -> None:
    with pytest.raises(ConfigError, match="exp_id"):
        make_client(exp_id=exp_id)


def test_task_ids_become_keys_only_when_they_fit_in_a_rollout_id() -> None:
    assert task_key({"task_id": "task_1-a"}) == "task_1-a"
    for given in ("café", "a b", "h#1", "..", 7):
        key = task_key({"task_id": given})
        assert is_safe_id(key), key
    assert task_key({"task_id": "café"}) != "café"
    assert task_key({"task_id": "a" * 64}) == "a" * 64
    assert len(task_key({"task_id": "a" * 251})) == 16  # hashed: file names stay legal


def test_a_valid_exp_id_runs(make_client: Callable[..., RolloutClient]) -> None:
    client = make_client(exp_id="Run_2.b-3")
    item = next(iter(client.run_batch([{"task_id": "café", "chats": 1}])))
    assert item.success, item.error


def test_the_longest_exp_id_and_task_id_run_and_are_stored(
    make_client: Callable[..., RolloutClient],
) -> None:
    client = make_client(exp_id="e" * 100)
    tasks = [{"task_id": "a" * 251, "chats": 1}, {"task_id": "b" * 64, "chats": 1}]
    items = list(client.run_batch(tasks))
    assert all(item.success for item in items), [item.error for item in items]
    assert all(item.result.status == "completed" for item in items)


def test_invoke_with_a_seed_draws_the_same_engine_seed_each_time_and_as_a_batch(
    make_client: Callable[..., RolloutClient],
) -> None:
    client = make_client(seed=1)
    task = {"task_id": "seeded", "reward": 1.0}
    seeds = [
        client.invoke(task).result(timeout=30).trajectory.turns[0].sampling["seed"]
        for _ in range(2)
    ]
    (item,) = list(client.run_batch([task]))
    batch_seed = item.result.trajectory.turns[0].sampling["seed"]
    assert seeds[0] == seeds[1] == batch_seed
    # The documented derivation: sha256("1:seeded.0"), first 4 bytes, little-endian.
    digest = hashlib.sha256(b"1:seeded.0").digest()
    assert batch_seed == int.from_bytes(digest[:4], "little")
    other = client.invoke({"task_id": "other", "reward": 1.0}).result(timeout=30)
    assert other.trajectory.turns[0].sampling["seed"] != batch_seed
