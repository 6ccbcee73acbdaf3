"""A record is ``truncated`` when a gateway limit ended its rollout; a turn cut by the request's
own ``max_tokens`` marks the trajectory truncated but leaves the record ``completed``."""

from __future__ import annotations

from collections.abc import Callable

from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig

MakeClient = Callable[..., RolloutClient]


def test_a_turn_cut_by_max_tokens_leaves_the_record_completed(make_client: MakeClient) -> None:
    client = make_client(SimConfig(output_len=16), max_tokens=4)
    record = client.invoke({"task_id": "t", "chats": 2}).result(30)
    trajectory = record.trajectory
    assert trajectory is not None
    assert [turn.finish_reason for turn in trajectory.turns] == ["length", "length"]
    assert trajectory.is_truncated and trajectory.truncation_reason is None
    assert record.status == "completed"


def test_a_gateway_limit_makes_the_record_truncated(make_client: MakeClient) -> None:
    client = make_client(max_turns=1)
    record = client.invoke({"task_id": "t", "chats": 2}).result(30)
    trajectory = record.trajectory
    assert trajectory is not None and len(trajectory.turns) == 1
    assert trajectory.turns[0].finish_reason == "stop"
    assert trajectory.is_truncated and trajectory.truncation_reason == "max_turns"
    assert record.status == "truncated"
