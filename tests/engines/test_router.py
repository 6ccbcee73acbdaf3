"""Routing across simulated SGLang servers: sticky rollouts, load spread, ejection, return."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from typing import Any

import httpx
import pytest

from rollway.engines import engine_from_spec
from rollway.engines.router import RoutedEngine
from rollway.engines.sglang import SGLangEngine
from rollway.engines.sim import SimConfig
from rollway.engines.sim_server import create_sim_server_app
from rollway.errors import EngineError
from rollway.gateway import BackgroundServer, ChatRenderer, Gateway
from rollway.gateway.metrics import GatewayMetrics
from rollway.types import SamplingParams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generations(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/rollway/stats").json()["generations"]


@pytest.fixture
def servers() -> Any:
    started = [BackgroundServer(create_sim_server_app(SimConfig(output_len=4))) for _ in range(3)]
    urls = [s.start() for s in started]
    yield urls
    for server in started:
        server.stop()


async def test_turns_of_a_rollout_stay_on_one_server_and_rollouts_spread(
    servers: list[str], renderer: ChatRenderer
) -> None:
    router = RoutedEngine([SGLangEngine(u) for u in servers], servers)
    gateway = Gateway(router, renderer, model_name="sim")

    async def rollout(index: int) -> None:
        rollout_id = f"r{index}"
        gateway.register(rollout_id, {"max_tokens": 4})
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {index}"}]
        for turn in range(3):
            reply = await gateway.chat(rollout_id, {"messages": messages})
            messages += [reply.message, {"role": "user", "content": f"go on {turn}"}]

    await asyncio.gather(*[rollout(i) for i in range(12)])
    await router.close()
    homes: dict[str, set[str]] = {}
    for url in servers:
        for request_id in generations(url):
            homes.setdefault(request_id.rsplit("-", 1)[0], set()).add(url)
    assert len(homes) == 12 and all(len(h) == 1 for h in homes.values())
    per_server = Counter(next(iter(h)) for h in homes.values())
    assert max(per_server.values()) - min(per_server.values()) <= 1
    assert router.sticky_hits == 12 * 2 and router.moves == 0


async def test_an_unhealthy_server_is_ejected_and_readmitted() -> None:
    port = free_port()
    app = create_sim_server_app(SimConfig(output_len=2))
    flaky = BackgroundServer(app, port=port)
    flaky.start()
    steady = BackgroundServer(create_sim_server_app(SimConfig(output_len=2)))
    steady_url = steady.start()
    flaky_url = f"http://127.0.0.1:{port}"
    router = RoutedEngine(
        [SGLangEngine(flaky_url), SGLangEngine(steady_url)], ["flaky", "steady"],
        eject_after=2, readmit_after=1, health_interval_s=3600,
    )  # fmt: skip
    try:
        flaky.stop()
        await router.check_health()
        await router.check_health()
        assert router.stats()["endpoints"]["flaky"]["healthy"] is False
        sampling = SamplingParams(max_tokens=2)
        for i in range(4):
            await router.generate([1, 2, 3], sampling, f"after-eject{i}-0")
        assert len(generations(steady_url)) == 4
        back = BackgroundServer(app, port=port)
        back.start()
        try:
            await router.check_health()
            assert router.stats()["endpoints"]["flaky"]["healthy"] is True
            await router.generate([1, 2, 3], sampling, "fresh-0")
            assert "fresh-0" in generations(flaky_url)
        finally:
            back.stop()
        stats = router.stats()["endpoints"]["flaky"]
        assert stats["ejections"] == 1 and stats["readmissions"] == 1
        metrics = GatewayMetrics()
        metrics.observe_engine(router)
        text = metrics.render().decode()
        assert 'rollway_engine_endpoint_ejections{endpoint="flaky"} 1.0' in text
        assert 'rollway_engine_endpoint_healthy{endpoint="flaky"} 1.0' in text
    finally:
        await router.close()
        steady.stop()


async def test_no_healthy_server_is_an_engine_error() -> None:
    router = RoutedEngine(
        [SGLangEngine(f"http://127.0.0.1:{free_port()}")], eject_after=1, health_interval_s=3600
    )
    await router.check_health()
    with pytest.raises(EngineError, match="no healthy"):
        await router.generate([1], SamplingParams(), "x-0")
    await router.close()


def test_several_hosts_in_a_spec_give_a_routed_engine() -> None:
    engine = engine_from_spec("sglang://127.0.0.1:1,127.0.0.1:2")
    assert isinstance(engine, RoutedEngine)
    assert [e.name for e in engine.endpoints] == ["127.0.0.1:1", "127.0.0.1:2"]
    first, second = (e.engine for e in engine.endpoints)
    assert first.http is second.http  # one connection pool per process, not per endpoint


async def test_connect_failures_count_toward_ejection() -> None:
    dead = SGLangEngine(f"http://127.0.0.1:{free_port()}")
    router = RoutedEngine([dead], ["dead"], eject_after=1, health_interval_s=3600)
    with pytest.raises(EngineError, match="cannot connect"):
        await router.generate([1], SamplingParams(), "y-0")
    assert router.stats()["endpoints"]["dead"]["healthy"] is False
    await router.close()
