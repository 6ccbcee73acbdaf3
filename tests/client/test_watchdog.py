"""The stuck-rollout watchdog: a hung engine call or a slow agent is reported with where it
waits, counted on /metrics and in the status lines, and with abort_stuck ended as a timeout."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from rollway.client import RolloutClient
from rollway.client.progress import BatchProgress
from rollway.client.watchdog import describe
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError
from rollway.events import RolloutEvent, RolloutStuck
from tests.agents.server.fixtures import wait_until

MakeClient = Callable[..., RolloutClient]


def stuck_events(heard: list[RolloutEvent]) -> list[RolloutStuck]:
    return [e for e in heard if isinstance(e, RolloutStuck)]


def test_a_hung_engine_call_is_reported_by_request_and_aborted_as_a_timeout(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[RolloutEvent] = []
    client = make_client(
        SimConfig(latency_s=60), stuck_after_s=0.3, abort_stuck=True, on_event=heard.append
    )
    with caplog.at_level(logging.WARNING, logger="rollway.client.watchdog"):
        record = client.invoke({"task_id": "hang"}).result(timeout=20)
    [stuck] = stuck_events(heard)
    assert (stuck.rollout_id, stuck.waiting_in) == (record.rollout_id, "engine")
    assert stuck.request_id == f"{record.rollout_id}-1" and stuck.idle_s >= 0.3
    assert record.status == "timeout" and record.attempts == 1
    assert f"waiting on the engine (request {stuck.request_id})" in (record.reason or "")
    assert record.elapsed_s < 10  # not the engine's 60 s
    assert [r.getMessage() for r in caplog.records] == [record.reason]
    assert [e.kind for e in heard][-1] == "rollout_finished"


def test_a_slow_agent_is_reported_once_shown_in_metrics_and_left_to_finish(
    make_client: MakeClient,
) -> None:
    heard: list[RolloutEvent] = []
    client = make_client(stuck_after_s=0.2, on_event=heard.append)
    gateway = client.gateway.gateway  # type: ignore[attr-defined]
    future = client.invoke({"task_id": "slow", "wait": 1.5})
    wait_until(lambda: b"rollway_rollouts_stuck 1.0" in gateway.metrics.render())
    assert client._watchdog.stuck == 1
    record = future.result(timeout=20)
    assert record.status == "completed"
    [stuck] = stuck_events(heard)
    assert (stuck.waiting_in, stuck.request_id) == ("agent", None)
    wait_until(lambda: b"rollway_rollouts_stuck 0.0" in gateway.metrics.render())


@pytest.mark.parametrize("off", [None, 0])  # 0 as with ``rollway run --stuck-after 0``
def test_no_watchdog_when_turned_off(make_client: MakeClient, off: float | None) -> None:
    heard: list[RolloutEvent] = []
    client = make_client(stuck_after_s=off, on_event=heard.append)
    assert client.invoke({"task_id": "slow", "wait": 0.3}).result(timeout=20).status == (
        "completed"
    )
    assert not stuck_events(heard)
    assert client._watchdog.after_s is None
    with pytest.raises(ConfigError, match="stuck_after_s"):
        make_client(stuck_after_s=-1)


def test_status_lines_count_stuck_rollouts(caplog: pytest.LogCaptureFixture) -> None:
    stuck = [0]
    progress = BatchProgress(4, show=False, stuck=lambda: stuck[0])
    with caplog.at_level(logging.INFO, logger="rollway.client"):
        progress.status_line()
        stuck[0] = 2
        progress.status_line()
    first, second = (r.getMessage() for r in caplog.records)
    assert "stuck" not in first and second.endswith("| 2 stuck")


@pytest.mark.parametrize(("idle_s", "said"), [(0.54, "0.5 s"), (0.96, "1.0 s"), (312.4, "312 s")])
def test_the_reason_gives_the_idle_time_as_measured(idle_s: float, said: str) -> None:
    event = RolloutStuck(rollout_id="r", waiting_in="agent", request_id=None, idle_s=idle_s)
    assert describe(event) == f"stuck: no progress for {said}, in its agent (no model call pending)"
