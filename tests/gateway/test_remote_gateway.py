"""A client on a shared ``rollway gateway`` (``RemoteGateway``): same records as in-process,
clear errors for a wrong address or key, and re-registration rules for restarted clients."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rollway.client import RolloutClient
from rollway.errors import ConfigError, RolloutClosedError
from rollway.gateway import Gateway
from rollway.gateway.remote_gateway import RemoteGateway
from tests.client.conftest import ScriptedAgent
from tests.conftest import Served


def test_in_process_agents_record_through_a_remote_gateway(served: Served, tmp_path: Path) -> None:
    gateway = RemoteGateway(served.url, admin_key=served.admin_key)
    assert gateway.model_name == "SmolLM2-135M-Instruct"
    with RolloutClient(
        ScriptedAgent, gateway, store=str(tmp_path), exp_id="remote-gw", max_tokens=6
    ) as client:
        items = list(client.run_batch([{"task_id": "a", "chats": 2}], group_size=2))
    assert [item.result.status for item in items] == ["completed", "completed"]
    for item in items:
        trajectory = item.result.trajectory
        assert trajectory is not None and len(trajectory.turns) == 2
        first, second = trajectory.prompt_ids(0), trajectory.prompt_ids(1)
        assert second[: len(first)] == first
        assert all(len(turn.completion_ids) <= 6 for turn in trajectory.turns)
        assert item.result.metrics.llm_calls == 2
        # ctx.chat through the served gateway answers what its turns recorded.
        answers = ScriptedAgent.answers[item.result.rollout_id]
        assert [(a.completion_ids, a.logprobs, a.turn_index) for a in answers] == [
            (turn.completion_ids, turn.logprobs, turn.index) for turn in trajectory.turns
        ]
    assert not [r for r in served.gateway._rollouts if r.startswith("remote-gw.")]


def test_a_wrong_gateway_address_or_key_fails_early(served: Served) -> None:
    with pytest.raises(ConfigError, match="refused the admin key"):
        RemoteGateway(served.url, admin_key="wrong")
    with pytest.raises(ConfigError, match="no gateway"):
        RemoteGateway("http://127.0.0.1:9", admin_key="k")


def test_registering_an_open_id_again_needs_reuse_and_keeps_its_key(gateway: Gateway) -> None:
    first = gateway.register("r1", {})
    with pytest.raises(RolloutClosedError):
        gateway.register("r1", {})
    assert gateway.register("r1", {}, reuse=True).api_key == first.api_key


def test_register_with_reuse_over_http(served: Served) -> None:
    url = f"{served.url}/v1/rollouts/reuse-http/register"
    first = httpx.post(url, json={}, headers=served.admin_headers).json()
    assert httpx.post(url, json={}, headers=served.admin_headers).status_code == 409
    again = httpx.post(f"{url}?reuse=true", json={}, headers=served.admin_headers).json()
    assert again["api_key"] == first["api_key"]
    httpx.post(f"{served.url}/v1/rollouts/reuse-http/unregister", headers=served.admin_headers)


def test_a_stale_registration_is_replaced_for_in_process_agents(
    served: Served, tmp_path: Path
) -> None:
    stale = served.gateway.register("stale.s.0.1", {})
    gateway = RemoteGateway(served.url, admin_key=served.admin_key)
    with RolloutClient(
        ScriptedAgent, gateway, store=str(tmp_path), exp_id="stale", max_tokens=4
    ) as client:
        (item,) = client.run_batch([{"task_id": "s"}])
    assert item.result.status == "completed" and item.result.rollout_id == "stale.s.0.1"
    assert item.result.trajectory is not None and len(item.result.trajectory.turns) == 1
    assert "stale.s.0.1" not in served.gateway._rollouts and stale.api_key
