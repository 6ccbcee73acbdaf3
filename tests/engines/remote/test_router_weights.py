"""A routed fleet takes new weights as one: every endpoint pauses, loads and resumes together;
one that misses the update is ejected and comes back only after loading the fleet's weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollway.engines import engine_from_spec
from rollway.engines.remote.router import RoutedEngine
from rollway.engines.sim import SimConfig
from rollway.errors import EngineError
from rollway.generation import SamplingParams
from rollway.simulators.sglang_server import SGLangSimConfig, create_app
from rollway.web.background_server import BackgroundServer

PROMPT = [1, 9690, 198, 2683]
SAMPLING = SamplingParams(max_tokens=4)
#: No health round but the test's own.
HOURS = 3600.0


def fleet_of(urls: list[str]) -> RoutedEngine:
    spec = "sglang://" + ",".join(url.removeprefix("http://") for url in urls)
    engine = engine_from_spec(spec)
    assert isinstance(engine, RoutedEngine)
    return engine


async def generate_on_each(fleet: RoutedEngine, tag: str) -> dict[str, list[int]]:
    """One generation per endpoint (distinct rollouts spread over the least-loaded)."""
    versions: dict[str, list[int]] = {}
    for index, endpoint in enumerate(fleet.endpoints):
        result = await endpoint.engine.generate(PROMPT, SAMPLING, f"{tag}{index}-1")
        assert result.policy_versions is not None
        versions[endpoint.name] = result.policy_versions
    return versions


@pytest.mark.timeout(60)
async def test_every_endpoint_takes_the_update_and_stamps_the_new_version(tmp_path: Path) -> None:
    app = lambda: create_app(SimConfig(output_len=4), SGLangSimConfig())  # noqa: E731
    with BackgroundServer(app()) as a, BackgroundServer(app()) as b:
        fleet = fleet_of([a, b])
        try:
            assert fleet.pause_modes >= {"abort", "drain"}
            await fleet.update_weights(str(tmp_path), 1)
            assert fleet.policy_version == 1
            assert set(map(tuple, (await generate_on_each(fleet, "v")).values())) == {(1,) * 4}
            result = await fleet.generate(PROMPT, SAMPLING, "routed-1")
            assert result.policy_versions == [1] * 4
        finally:
            await fleet.close()


@pytest.mark.timeout(60)
async def test_an_endpoint_down_during_the_update_returns_only_with_the_new_weights(
    tmp_path: Path,
) -> None:
    app = lambda: create_app(SimConfig(output_len=4), SGLangSimConfig())  # noqa: E731
    with BackgroundServer(app()) as steady:
        late = BackgroundServer(app())
        late_url = late.start()
        port = int(late_url.rsplit(":", 1)[1])
        fleet = fleet_of([steady, late_url])
        try:
            late.stop()  # down while the fleet updates
            await fleet.update_weights(str(tmp_path), 1)
            down = fleet.endpoints[1]
            assert not down.healthy and down.stale and fleet.policy_version == 1
            # The same server comes back (with the weights it was started with).
            with BackgroundServer(app(), port=port):
                await fleet.check_health()
                assert not down.healthy and down.stale  # one good check of readmit_after=2
                await fleet.check_health()
                assert down.healthy and not down.stale
                assert down.engine.policy_version == 1  # the update was replayed on it
                result = await down.engine.generate(PROMPT, SAMPLING, "back-1")
                assert result.policy_versions == [1] * 4
        finally:
            await fleet.close()


@pytest.mark.timeout(60)
async def test_a_source_no_endpoint_can_load_fails_the_update_and_keeps_the_fleet() -> None:
    app = lambda: create_app(SimConfig(output_len=4), SGLangSimConfig())  # noqa: E731
    with BackgroundServer(app()) as a, BackgroundServer(app()) as b:
        fleet = fleet_of([a, b])
        try:
            with pytest.raises(EngineError, match="Failed to get weights iterator"):
                await fleet.update_weights("/no/such/checkpoint", 1)
            assert fleet.policy_version == 0
            assert all(e.healthy for e in fleet.endpoints)  # a bad source is not a bad server
            result = await fleet.generate(PROMPT, SAMPLING, "after-1")  # resumed
            assert result.policy_versions == [0] * 4
        finally:
            await fleet.close()


@pytest.mark.timeout(60)
async def test_a_server_restarted_between_checks_is_taken_out_and_caught_up(
    tmp_path: Path,
) -> None:
    app = lambda: create_app(SimConfig(output_len=4), SGLangSimConfig())  # noqa: E731
    with BackgroundServer(app()) as steady:
        first = BackgroundServer(app())
        url = first.start()
        fleet = fleet_of([steady, url])
        try:
            await fleet.update_weights(str(tmp_path), 1)
            first.stop()  # killed and restarted faster than a health check notices
            with BackgroundServer(app(), port=int(url.rsplit(":", 1)[1])):
                restarted = fleet.endpoints[1]
                # It reports weight_version "default": out at once, then back once caught up.
                await fleet.check_health()
                assert (restarted.ejections, restarted.readmissions) == (1, 0)
                await fleet.check_health()
                assert (restarted.ejections, restarted.readmissions) == (1, 1)
                assert restarted.healthy and not restarted.stale
                assert restarted.engine.policy_version == 1
                result = await restarted.engine.generate(PROMPT, SAMPLING, "again-1")
                assert result.policy_versions == [1] * 4
        finally:
            await fleet.close()


@pytest.mark.timeout(60)
async def test_a_rolling_restart_after_an_update_brings_every_server_back_caught_up(
    tmp_path: Path,
) -> None:
    """Router defaults (eject after 3 failed checks, re-admit after 2 good ones); the test runs
    the rounds itself. Each server in turn is killed, serves nothing while down, and comes back
    with its start-up weights: it returns only once the update is replayed on it."""
    app = lambda: create_app(SimConfig(output_len=4), SGLangSimConfig())  # noqa: E731
    servers = [BackgroundServer(app()) for _ in range(2)]
    urls = [server.start() for server in servers]
    fleet = fleet_of(urls)
    fleet.health_interval_s = HOURS
    try:
        await fleet.update_weights(str(tmp_path), 1)
        for index, endpoint in enumerate(fleet.endpoints):
            servers[index].stop()
            for _ in range(fleet.eject_after):
                await fleet.check_health()
            assert not endpoint.healthy
            result = await fleet.generate(PROMPT, SAMPLING, f"while{index}-1")  # the other one
            assert result.policy_versions == [1] * 4
            servers[index] = BackgroundServer(app(), port=int(urls[index].rsplit(":", 1)[1]))
            servers[index].start()
            await fleet.check_health()
            assert not endpoint.healthy and endpoint.stale  # it serves "default" weights
            await fleet.check_health()
            assert endpoint.healthy and not endpoint.stale
            assert endpoint.engine.policy_version == 1
        assert all(e.healthy for e in fleet.endpoints) and fleet.policy_version == 1
        assert [e.readmissions for e in fleet.endpoints] == [1, 1]
        versions = await generate_on_each(fleet, "after")
        assert set(map(tuple, versions.values())) == {(1,) * 4}  # what each server reports
    finally:
        await fleet.close()
        for server in servers:
            server.stop()


@pytest.mark.timeout(60)
async def test_a_fleet_sharing_the_servers_adopts_an_update_another_loaded(tmp_path: Path) -> None:
    """Two gateway workers' fleets over the same servers: one loads, the other adopts the
    version; each server loads once, and the adopter's tokens carry the version."""
    apps = [create_app(SimConfig(output_len=4), SGLangSimConfig()) for _ in range(2)]
    with BackgroundServer(apps[0]) as a, BackgroundServer(apps[1]) as b:
        loader, adopter = fleet_of([a, b]), fleet_of([a, b])
        try:
            await loader.update_weights(str(tmp_path), 1)
            await adopter.adopt_weights(str(tmp_path), 1)
            assert adopter.policy_version == 1
            assert set(map(tuple, (await generate_on_each(adopter, "a")).values())) == {(1,) * 4}
        finally:
            await loader.close()
            await adopter.close()
    assert [app.state.simulator.labels for app in apps] == [["default", "1"]] * 2
