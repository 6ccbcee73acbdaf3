"""A client on a shared ``rollway gateway`` (``RemoteGateway``): same records as in-process,
clear errors for a wrong address or key, re-registration rules for restarted clients, and an
engine outage behind it told apart from the gateway's own."""

from __future__ import annotations

import asyncio
import secrets
import socket
from pathlib import Path

import httpx
import pytest

from rollway.client import RolloutClient
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError, EngineConnectError, RolloutClosedError
from rollway.gateway import Gateway, create_app
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.request_schema import RegisterRequest
from rollway.simulators import create_sim_server_app
from rollway.web.background_server import BackgroundServer
from tests.client.conftest import ScriptedAgent
from tests.conftest import Served, sim_gateway
from tests.outcomes import ENDED


def test_in_process_agents_record_through_a_remote_gateway(served: Served, tmp_path: Path) -> None:
    gateway = RemoteGateway(served.url, admin_key=served.admin_key)
    assert gateway.model_name == "SmolLM2-135M-Instruct"
    with RolloutClient(
        ScriptedAgent, gateway, store=str(tmp_path), exp_id="remote-gw", max_tokens=6
    ) as client:
        items = list(client.run_batch([{"task_id": "a", "chats": 2}], group_size=2))
    assert len(items) == 2 and all(item.result.status in ENDED for item in items)
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
    assert item.result.status in ENDED and item.result.rollout_id == "stale.s.0.1"
    assert item.result.trajectory is not None and len(item.result.trajectory.turns) == 1
    assert "stale.s.0.1" not in served.gateway._rollouts and stale.api_key


def test_an_engine_that_cannot_be_reached_is_an_outage_the_gateway_names(
    renderer: ChatRenderer,
) -> None:
    """Its health says the gateway serves and the engine is down; a chat answers 503 with the
    error's class, which the client rebuilds; both come back once the engine serves there."""
    with socket.socket() as probe:  # a port nothing listens on, until the engine starts there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = VLLMEngine(f"http://127.0.0.1:{port}")
    gateway = Gateway(engine, renderer, model_name="sim")
    key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=key, close_engine=False)) as url:
        remote = RemoteGateway(url, admin_key=key)  # the engine's outage is no reason to refuse
        health = httpx.get(f"{url}/health")
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "model": "sim", "engine": "down"}
        rollout = httpx.post(
            f"{url}/v1/rollouts/r1/register", json={}, headers={"Authorization": f"Bearer {key}"}
        ).json()
        chat = httpx.post(
            f"{rollout['base_url']}/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {rollout['api_key']}"},
            timeout=30,
        )
        assert chat.status_code == 503
        assert chat.json()["error"]["code"] == "EngineConnectError"

        async def probes() -> tuple[bool, bool, BaseException | None]:
            try:
                await remote.register("r2", RegisterRequest())
                chatted = await asyncio.gather(
                    remote.chat("r2", {"messages": [{"role": "user", "content": "hi"}]}),
                    return_exceptions=True,
                )
                return await remote.health(), await remote.engine_health(), chatted[0]
            finally:
                await remote.close()

        gateway_up, engine_up, error = asyncio.run(probes())
        assert (gateway_up, engine_up) == (True, False)
        assert isinstance(error, EngineConnectError)
        sim = create_sim_server_app(SimConfig(), protocol="vllm")
        with BackgroundServer(sim, port=port):
            assert httpx.get(f"{url}/health").json()["engine"] == "up"
            assert asyncio.run(_engine_health(remote))
    asyncio.run(engine.close())


async def _engine_health(remote: RemoteGateway) -> bool:
    try:
        return await remote.engine_health()
    finally:
        await remote.close()


def test_the_engine_probe_leaves_a_gateway_that_does_not_answer_to_its_own_probe(
    renderer: ChatRenderer,
) -> None:
    """A gateway that is down is one outage (the gateway's), not two."""
    key = f"ak-{secrets.token_hex(8)}"
    app = create_app(sim_gateway(renderer), admin_key=key)
    with BackgroundServer(app) as url:
        remote = RemoteGateway(url, admin_key=key)
        assert asyncio.run(_engine_health(remote)) is True
    assert asyncio.run(_engine_health(remote)) is True  # gone: not the engine's outage
