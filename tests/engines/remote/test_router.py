"""Routing across simulated SGLang servers: sticky rollouts, load spread, ejection, return,
and failing over past servers that are dead, killed mid-batch or late to start."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from rollway.engines import engine_from_spec
from rollway.engines.remote.router import RoutedEngine
from rollway.engines.remote.sglang import SGLangEngine
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError, EngineConnectError, EngineError
from rollway.gateway import Gateway
from rollway.gateway.metrics import GatewayMetrics
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import SamplingParams
from rollway.simulators import Fault, Protocol, create_sim_server_app
from rollway.web.background_server import BackgroundServer
from tests.engines import by_request_id

AfterTurn = Callable[[str, int], Awaitable[None]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generations(url: str) -> dict[str, int]:
    return by_request_id(httpx.get(f"{url}/rollway/stats").json())["generations"]


def routed(spec: str) -> RoutedEngine:
    engine = engine_from_spec(spec)
    assert isinstance(engine, RoutedEngine)
    return engine


def host(url: str) -> str:
    return url.removeprefix("http://")


def sim_app(protocol: Protocol = "sglang", fault: Fault = "none", **config: Any) -> Any:
    config = {"latency_s": 0.01, "output_len": 4, **config}
    return create_sim_server_app(SimConfig(**config), protocol=protocol, fault=fault)


async def drive(
    gateway: Gateway,
    rollout_ids: list[str],
    *,
    turns: int,
    limit: int,
    think_s: float = 0.0,
    after_turn: AfterTurn | None = None,
) -> dict[str, tuple[str, EngineError]]:
    """Runs the rollouts, ``limit`` at a time, each ``turns`` turns with ``think_s`` of agent
    work between them; returns the failed ones: rollout id -> (request id, error)."""
    gate = asyncio.Semaphore(limit)
    failed: dict[str, tuple[str, EngineError]] = {}

    async def rollout(rollout_id: str) -> None:
        async with gate:
            gateway.register(rollout_id, {"max_tokens": 4})
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rollout_id}"}]
            for turn in range(turns):
                try:
                    reply = await gateway.chat(rollout_id, {"messages": messages})
                except EngineError as exc:
                    failed[rollout_id] = (f"{rollout_id}-{turn + 1}", exc)
                    return
                if after_turn is not None:
                    await after_turn(rollout_id, turn)
                messages += [reply.message, {"role": "user", "content": f"go on {turn}"}]
                await asyncio.sleep(think_s)

    await asyncio.gather(*[rollout(r) for r in rollout_ids])
    return failed


def homes(seen: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """Rollout id -> the servers that generated its turns, from each server's counts."""
    found: dict[str, set[str]] = {}
    for server, counts in seen.items():
        for request_id in counts:
            found.setdefault(request_id.rsplit("-", 1)[0], set()).add(server)
    return found


def assert_each_request_ran_once(seen: dict[str, dict[str, int]]) -> None:
    everywhere = Counter[str]()
    for counts in seen.values():
        everywhere.update(counts)
    assert everywhere and set(everywhere.values()) == {1}, everywhere.most_common(3)


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


async def test_a_refused_connect_ejects_the_server_at_once() -> None:
    router = routed(f"sglang://127.0.0.1:{free_port()},127.0.0.1:{free_port()}")
    assert await router.health()  # in rotation until something says otherwise
    with pytest.raises(EngineConnectError, match="cannot connect"):
        await router.generate([1], SamplingParams(), "y-0")
    endpoints = router.stats()["endpoints"].values()
    assert [e["healthy"] for e in endpoints] == [False, False]
    assert [e["refused"] for e in endpoints] == [1, 1]  # each tried once, none twice
    # A fleet with no endpoint in rotation is down: rollouts wait for it instead of failing.
    assert not await router.health()
    await router.close()


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
async def test_a_dead_server_in_the_fleet_costs_no_rollout(
    protocol: Protocol, renderer: ChatRenderer
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with BackgroundServer(sim_app(protocol)) as a, BackgroundServer(sim_app(protocol)) as b:
        router = routed(f"{protocol}://{dead},{host(a)},{host(b)}")
        gateway = Gateway(router, renderer, model_name="sim")
        try:
            failed = await drive(gateway, [f"r{i}" for i in range(45)], turns=3, limit=9)
        finally:
            await router.close()
        seen = {a: generations(a), b: generations(b)}
    assert failed == {}
    assert_each_request_ran_once(seen)
    # Every rollout ran all its turns on one live server: a refused one moved for good.
    where = homes(seen)
    assert len(where) == 45 and all(len(w) == 1 for w in where.values())
    assert sum(len(c) for c in seen.values()) == 45 * 3
    stats = router.stats()["endpoints"][dead]
    # Ejected by the first wave (at most `limit` rollouts chose it at once), never sent more.
    assert stats["healthy"] is False and stats["ejections"] == 1
    assert 1 <= stats["refused"] <= 9 and router.moves == stats["refused"]
    metrics = GatewayMetrics()
    metrics.observe_engine(router)
    refused = f'rollway_engine_endpoint_refused{{endpoint="{dead}"}} {float(stats["refused"])}'
    assert refused in metrics.render().decode()


async def test_a_server_that_starts_late_is_skipped_then_admitted(renderer: ChatRenderer) -> None:
    port = free_port()
    late = f"127.0.0.1:{port}"
    with BackgroundServer(sim_app()) as a, BackgroundServer(sim_app()) as b:
        router = routed(f"sglang://{late},sglang://{host(a)},sglang://{host(b)}")
        router.health_interval_s = 3600  # the test runs the checks itself
        gateway = Gateway(router, renderer, model_name="sim")
        try:
            early = await drive(gateway, [f"e{i}" for i in range(30)], turns=2, limit=6)
            while_down = router.stats()["endpoints"][late]
            with BackgroundServer(sim_app(), port=port) as late_url:
                await router.check_health()
                assert router.stats()["endpoints"][late]["healthy"] is False  # one good check
                await router.check_health()
                assert router.stats()["endpoints"][late]["healthy"] is True
                after = await drive(gateway, [f"s{i}" for i in range(30)], turns=2, limit=6)
                seen = {a: generations(a), b: generations(b), late_url: generations(late_url)}
        finally:
            await router.close()
    assert early == {} and after == {}
    assert while_down["healthy"] is False and 1 <= while_down["refused"] <= 6
    assert router.stats()["endpoints"][late]["readmissions"] == 1
    assert_each_request_ran_once(seen)
    assert seen[late_url] and all(r.startswith("s") for r in seen[late_url])


@contextmanager
def sim_server_process(*options: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``rollway sim-server`` process on a free loopback port, listening when this yields."""
    address = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "rollway", "sim-server", "--latency-s", "0.01",
               "--output-len", "4", "--port", address.split(":")[1], *options]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.DEVNULL) as proc:
        try:
            deadline = time.monotonic() + 60
            # Not /health: SGLang's runs a generation and answers after a second at best.
            while not _answers(f"http://{address}/get_model_info"):
                assert proc.poll() is None and time.monotonic() < deadline, f"{address} not up"
                time.sleep(0.05)
            yield proc, address
        finally:
            proc.kill()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


async def test_a_server_killed_mid_batch_fails_only_what_had_reached_it(
    renderer: ChatRenderer,
) -> None:
    # The process's first two generations hang: they are running when it is killed.
    with (
        sim_server_process("--fault", "hang", "--fault-count", "2") as (proc, doomed),
        BackgroundServer(sim_app()) as a,
        BackgroundServer(sim_app()) as b,
    ):
        router = routed(f"sglang://{doomed},{host(a)},{host(b)}")
        gateway = Gateway(router, renderer, model_name="sim")
        victims: list[str] = []
        one_at_a_time = asyncio.Lock()

        async def kill_it_between_turns(rollout_id: str, turn: int) -> None:
            """The first rollout whose first turn ran on the process kills it, between turns."""
            async with one_at_a_time:
                if turn > 0 or victims:
                    return
                async with httpx.AsyncClient() as client:
                    answer = await client.get(f"http://{doomed}/rollway/stats")
                    stats = by_request_id(answer.json())
                if f"{rollout_id}-1" in stats["generations"]:
                    proc.kill()
                    proc.wait()
                    victims.append(rollout_id)

        try:
            failed = await drive(gateway, [f"r{i}" for i in range(45)], turns=4, limit=15,
                                 think_s=0.02, after_turn=kill_it_between_turns)  # fmt: skip
        finally:
            await router.close()
        seen = {a: generations(a), b: generations(b)}
    # The victim was between turns when its server died: its next turn was refused and moved,
    # and the rest of its turns stayed on the server that took it.
    (victim,) = victims
    assert victim not in failed
    assert len(homes(seen)[victim]) == 1
    assert sum(r.startswith(f"{victim}-") for c in seen.values() for r in c) == 3
    # Exactly the two running on it failed (cut off mid-request), and were not re-sent.
    assert len(failed) == 2
    for request_id, error in failed.values():
        assert not isinstance(error, EngineConnectError)
        assert doomed in str(error) and "failed after sending" in str(error)
        assert all(request_id not in counts for counts in seen.values())
    assert_each_request_ran_once(seen)
    stats = router.stats()["endpoints"][doomed]
    assert stats["healthy"] is False and stats["refused"] >= 1


async def test_a_turn_on_a_server_that_stops_answering_is_reissued_when_it_is_ejected(
    renderer: ChatRenderer,
) -> None:
    """A server process stopped (SIGSTOP) with a turn running on it: router defaults (ejected
    after 3 failed health checks), its checks quickened. The turn ends there by the ejection and is
    re-issued on the live server, a slower turn instead of a rollout that times out."""
    with (
        sim_server_process("--fault", "hang", "--fault-count", "1") as (proc, stopped),
        BackgroundServer(sim_app()) as live,
    ):
        router = routed(f"sglang://{stopped},{host(live)}")
        router.health_interval_s = 0.05
        # Each check of the stopped server waits this long (the live one keeps the default).
        router.endpoints[0].engine.health_timeout_s = 0.5
        gateway = Gateway(router, renderer, model_name="sim")
        gateway.register("h", {"max_tokens": 4})
        # Both idle: the first rollout goes to the first server, where it hangs.
        turn = asyncio.create_task(
            gateway.chat("h", {"messages": [{"role": "user", "content": "hi"}]})
        )
        try:
            async with httpx.AsyncClient() as client:
                running = await client.get(f"http://{stopped}/rollway/wait_in_flight", timeout=30)
            assert by_request_id(running.json())["in_flight"] == ["h-1"]
            proc.send_signal(signal.SIGSTOP)
            try:
                reply = await asyncio.wait_for(asyncio.shield(turn), 20)
            finally:
                proc.send_signal(signal.SIGCONT)
            trajectory = await gateway.trajectory("h")
        finally:
            turn.cancel()
            await asyncio.gather(turn, return_exceptions=True)
            await router.close()
        on_live = generations(live)
    (recorded,) = trajectory.turns
    assert recorded.request_id == "h-1.1" and recorded.reissued == 1
    assert reply.finish_reason == "stop" and reply.completion_ids == recorded.completion_ids
    assert on_live == {"h-1.1": 1} and trajectory.engine_errors == []
    stats = router.stats()["endpoints"][stopped]
    assert stats["healthy"] is False and stats["ejections"] == 1 and stats["in_flight"] == 0


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
@pytest.mark.parametrize("fault", ["5xx", "drop"])
async def test_a_request_that_reached_a_server_is_not_sent_to_another(
    protocol: Protocol, fault: Fault
) -> None:
    faulty_app = create_sim_server_app(SimConfig(), protocol=protocol, fault=fault)
    with BackgroundServer(faulty_app) as faulty, BackgroundServer(sim_app(protocol)) as steady:
        router = routed(f"{protocol}://{host(faulty)},{host(steady)}")
        try:
            with pytest.raises(EngineError, match="failed after sending") as caught:
                await router.generate([1, 2, 3], SamplingParams(max_tokens=4), "sent-1")
        finally:
            await router.close()
        on_faulty, on_steady = generations(faulty), generations(steady)
    assert not isinstance(caught.value, EngineConnectError)
    assert on_faulty == {"sent-1": 1} and on_steady == {}
    stats = router.stats()["endpoints"][host(faulty)]
    assert stats["healthy"] is True and stats["refused"] == 0 and router.moves == 0


async def test_when_every_server_refuses_the_error_names_them() -> None:
    hosts = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    router = routed("sglang://" + ",".join(hosts))
    try:
        with pytest.raises(EngineConnectError) as first:
            await router.generate([1], SamplingParams(), "z-1")
        with pytest.raises(EngineConnectError, match="no healthy engine endpoint") as then:
            await router.generate([1], SamplingParams(), "z-2")
    finally:
        await router.close()
    assert all(h in str(first.value) and h in str(then.value) for h in hosts)
    assert [e["refused"] for e in router.stats()["endpoints"].values()] == [1, 1, 1]


def test_the_scheme_may_be_repeated_for_each_host() -> None:
    engine = routed("vllm://127.0.0.1:1, vllm://127.0.0.1:2")
    assert [e.name for e in engine.endpoints] == ["127.0.0.1:1", "127.0.0.1:2"]
    backends = [e.engine for e in engine.endpoints]
    assert all(isinstance(b, VLLMEngine) for b in backends)
    assert [b.base_url for b in backends] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sglang://127.0.0.1:1,vllm://127.0.0.1:2", "mixes sglang:// with vllm://"),
        ("sglang://127.0.0.1:1,http://127.0.0.1:2", "mixes sglang:// with http://"),
        ("sglang://127.0.0.1:1,,127.0.0.1:2", "empty host"),
        ("sglang://127.0.0.1:1,", "empty host"),
        ("vllm://127.0.0.1:port", "bad host '127.0.0.1:port'"),
        ("sglang://127.0.0.1:1,127.0.0.1:1", "lists 127.0.0.1:1 twice"),
        ("sglang://a:01,a:1", "lists a:1 twice"),  # one server, spelt two ways
        ("sglang://A:1,sglang://a:1", "lists a:1 twice"),
        ("sglang://:30000", "bad host ':30000'"),
    ],
)
def test_a_malformed_fleet_spec_is_a_clear_config_error(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        engine_from_spec(spec)
