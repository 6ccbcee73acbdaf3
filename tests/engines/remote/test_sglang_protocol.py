"""The SGLang engine against a simulated SGLang server that answers as the real one does
(defaults, empty bodies, slow health, versions, pause modes, weight versions, routers, keys),
over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollway.engines import engine_from_spec
from rollway.engines.base import WeightSync
from rollway.engines.remote.connection import token_cap
from rollway.engines.remote.router import RoutedEngine
from rollway.engines.remote.sglang import SGLangEngine
from rollway.engines.remote.sglang_wire import parse_generate_response
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import ConfigError, EngineConnectError, EngineError
from rollway.generation import SamplingParams
from rollway.simulators.sglang_server import SGLangSimConfig, create_app
from rollway.web.background_server import BackgroundServer
from tests.engines import by_request_id

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356]


@contextmanager
def sglang_server(options: SGLangSimConfig | None = None, **config: Any) -> Iterator[str]:
    with BackgroundServer(create_app(SimConfig(**config), options)) as url:
        yield url


def stats(url: str) -> dict[str, Any]:
    return by_request_id(httpx.get(f"{url}/rollway/stats").json())


async def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.request(method, url, timeout=60, **kwargs)


async def until_in_flight(url: str, count: int) -> None:
    """Wait (a long poll) until ``count`` generations run on the server."""
    seen = (await call("GET", f"{url}/rollway/wait_in_flight?count={count}")).json()
    assert len(seen["in_flight"]) >= count


async def test_without_max_tokens_the_cap_is_the_context_room_not_sglangs_128() -> None:
    with sglang_server(SGLangSimConfig(context_length=4096), output_len=200) as url:
        engine = SGLangEngine(url)
        try:
            free = await engine.generate(PROMPT, SamplingParams(), "free-1")
        finally:
            await engine.close()
        assert (len(free.output_ids), free.finish_reason) == (200, "stop")  # not 128, "length"
        near_end = SGLangEngine(url, context_length=len(PROMPT) + 5)
        try:
            clipped = await near_end.generate(PROMPT, SamplingParams(max_tokens=64), "end-1")
        finally:
            await near_end.close()
    # SGLang refuses input + max_new_tokens >= context length: 4 tokens fit, not 5 (nor 64).
    assert (len(clipped.output_ids), clipped.finish_reason) == (4, "length")
    assert token_cap(None, 10, None, 4096) == 4096 and token_cap(None, 10, 50, 4096) == 40


@pytest.mark.parametrize(
    ("temperature", "server_original", "kind", "scale"),
    [
        (0.7, False, "processed_logprobs", 1 / 0.7),
        (1.0, False, "raw_logprobs", 1.0),
        (0.0, False, "raw_logprobs", 1.0),
        (0.7, True, "raw_logprobs", 1.0),
    ],
)
async def test_logprob_kind_follows_temperature_and_the_servers_setting(
    temperature: float, server_original: bool, kind: str, scale: float
) -> None:
    sampling = SamplingParams(max_tokens=6, seed=5, temperature=temperature)
    options = SGLangSimConfig(original_logprobs=server_original)
    with sglang_server(options, output_len=6) as url:
        engine = SGLangEngine(url, original_logprobs=True) if server_original else SGLangEngine(url)
        try:
            result = await engine.generate(PROMPT, sampling, "kind-1")
        finally:
            await engine.close()
    local = await SimEngine(SimConfig(output_len=6)).generate(PROMPT, sampling, "x")
    assert result.logprob_kind == kind
    assert result.logprobs == pytest.approx([lp * scale for lp in local.logprobs])


async def test_a_seed_for_a_server_older_than_0_5_3_names_the_field_and_is_not_sent() -> None:
    with sglang_server(SGLangSimConfig(version="0.4.9"), output_len=4) as url:
        engine = SGLangEngine(url)
        try:
            unseeded = await engine.generate(PROMPT, SamplingParams(max_tokens=4), "plain-1")
            with pytest.raises(EngineError, match=r"sampling_seed \(SGLang >= 0\.5\.3\)"):
                await engine.generate(PROMPT, SamplingParams(max_tokens=4, seed=1), "seeded-1")
        finally:
            await engine.close()
        assert stats(url)["generations"] == {"plain-1": 1}
        body = {"input_ids": PROMPT, "sampling_params": {"sampling_seed": 1}}
        opaque = await call("POST", f"{url}/generate", json=body)  # what the old client got
        assert (opaque.status_code, opaque.text) == (500, "Internal Server Error")
    assert unseeded.finish_reason == "stop"


async def test_abort_request_answers_an_empty_body_that_is_not_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with sglang_server(latency_s=30.0) as url:
        answer = await call("POST", f"{url}/abort_request", json={"rid": "nobody"})
        assert (answer.status_code, answer.content) == (200, b"")
        engine = SGLangEngine(url)
        try:
            with caplog.at_level(logging.WARNING, logger="rollway.engines.remote.connection"):
                await engine.abort("nobody")
        finally:
            await engine.close()
    assert not caplog.records


@pytest.mark.parametrize("version", ["latest", "0.5.5"])
async def test_an_aborted_generation_is_an_abort_result_on_old_and_new_servers(
    version: str,
) -> None:
    # SGLang before 0.5.6 sends no logprobs for a request aborted before its first token.
    with sglang_server(SGLangSimConfig(version=version), latency_s=30.0) as url:
        engine = SGLangEngine(url)
        try:
            call = asyncio.create_task(engine.generate(PROMPT, SamplingParams(), "cut-1"))
            await until_in_flight(url, 1)
            await engine.abort("cut-1")
            result = await call
        finally:
            await engine.close()
        assert stats(url)["generations"] == {"cut-1": 1}
    assert (result.output_ids, result.finish_reason, result.policy_versions) == ([], "abort", [])


def test_versions_come_from_spans_else_the_one_label_else_the_engines_own() -> None:
    def answer(**meta: Any) -> dict[str, Any]:
        pairs = [[-0.5, 10 + i, None] for i in range(5)]
        meta_info = {"finish_reason": {"type": "length"}, "output_token_logprobs": pairs, **meta}
        return {"output_ids": [10 + i for i in range(5)], "meta_info": meta_info}

    spans = [{"version": "default", "start": 0, "end": 3}, {"version": "4", "start": 3, "end": 5}]
    assert parse_generate_response(answer(weight_versions=spans)).policy_versions == [
        0, 0, 0, 4, 4,
    ]  # fmt: skip
    assert parse_generate_response(answer(weight_version="7")).policy_versions == [7] * 5
    own = parse_generate_response(answer(weight_version="base-v0"), policy_version=2)
    assert own.policy_versions == [2] * 5
    old_abort = {"output_ids": [3, 4], "meta_info": {"finish_reason": {"type": "abort"}}}
    result = parse_generate_response(old_abort)
    assert (result.output_ids, result.logprobs, result.finish_reason) == ([], [], "abort")
    partial = answer(weight_version="2") | {"output_ids": [10, 11]}
    partial["meta_info"] |= {
        "finish_reason": {"type": "abort", "message": "Abort before prefill"},
        "output_token_logprobs": [[-0.5, 10, None], [-0.25, 11, None]],
    }
    cut = parse_generate_response(partial)
    assert (cut.output_ids, cut.finish_reason, cut.policy_versions) == ([10, 11], "abort", [2, 2])


async def test_an_sglang_router_is_refused_with_the_workers_to_list() -> None:
    workers = ("http://10.0.0.1:30000", "http://10.0.0.2:30000")
    with sglang_server(SGLangSimConfig(router=True, workers=workers)) as url:
        engine = SGLangEngine(url)
        try:
            with pytest.raises(ConfigError, match=r"router .*sglang://10\.0\.0\.1:30000,10\.0"):
                await engine.generate(PROMPT, SamplingParams(max_tokens=4), "via-router-1")
        finally:
            await engine.close()
        assert stats(url)["generations"] == {}


async def test_a_server_that_cannot_be_reached_names_the_generate_not_the_probe() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    engine = SGLangEngine(url)
    try:
        with pytest.raises(EngineConnectError) as raised:
            await engine.generate(PROMPT, SamplingParams(max_tokens=4), "down-1")
        with pytest.raises(EngineConnectError) as streamed:
            async for _ in engine.generate_stream(PROMPT, SamplingParams(max_tokens=4), "down-2"):
                pass
    finally:
        await engine.close()
    for error in (raised.value, streamed.value):
        assert str(error).startswith(f"cannot connect to {url}/generate: ")
        assert "abort_request" not in str(error)  # the probe's route reads as a failed abort


async def test_health_uses_the_cheap_route_so_a_paused_server_stays_in() -> None:
    options = SGLangSimConfig(health_timeout_s=0.3, health_poll_s=0.05)
    with sglang_server(options) as url:
        engine = SGLangEngine(url)
        router = RoutedEngine([engine], [url], eject_after=1, health_interval_s=3600)
        try:
            assert await engine.http.get_ok(f"{url}/health")  # serving: SGLang's probe passes
            paused = await call("POST", f"{url}/pause_generation", json={"mode": "abort"})
            assert paused.status_code == 200
            assert not await engine.http.get_ok(f"{url}/health")  # the old probe: ejected
            await router.check_health()
            assert router.stats()["endpoints"][url]["healthy"] is True
        finally:
            await router.close()


@pytest.mark.parametrize("mode", ["abort", "drain", "keep"])
async def test_every_pause_mode_loses_no_request_and_runs_none_twice(
    mode: str, tmp_path: Path
) -> None:
    sampling = SamplingParams(max_tokens=32, seed=2)
    with sglang_server(latency_s=0.6, output_len=32) as url:
        engine = SGLangEngine(url)
        try:
            calls = [
                asyncio.create_task(engine.generate(PROMPT, sampling, f"p-{i}")) for i in range(4)
            ]
            await until_in_flight(url, 4)
            await asyncio.sleep(0.15)  # a part of each generation runs under version 0
            await engine.pause(mode)  # type: ignore[arg-type]
            late = asyncio.create_task(engine.generate(PROMPT, sampling, "p-late"))
            done, _ = await asyncio.wait({late}, timeout=0.2)
            assert not done  # a call made while paused waits at the server
            await engine.update_weights(tmp_path, 1)
            await engine.resume()
            results = await asyncio.gather(*calls)
            after = await late
        finally:
            await engine.close()
        counts = stats(url)["generations"]
    assert counts == {f"p-{i}": 1 for i in range(4)} | {"p-late": 1}
    assert (after.finish_reason, after.policy_versions) == ("stop", [1] * 32)
    for result in results:
        if mode == "abort":
            assert (result.finish_reason, result.output_ids) == ("abort", [])
        elif mode == "drain":
            assert (result.finish_reason, result.policy_versions) == ("stop", [0] * 32)
        else:
            versions = result.policy_versions or []
            assert result.finish_reason == "stop" and len(versions) == 32
            assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)


async def test_an_update_moves_the_stamped_version_and_bad_sources_are_refused(
    tmp_path: Path,
) -> None:
    with sglang_server(output_len=4) as url:
        engine = SGLangEngine(url)
        try:
            await engine.update_weights(tmp_path, 3)  # not paused: drain, load, resume
            result = await engine.generate(PROMPT, SamplingParams(max_tokens=4), "v3-1")
            with pytest.raises(EngineError, match="did not load weights from '/no/such'"):
                await engine.update_weights("/no/such", 4)
            with pytest.raises(ConfigError, match="checkpoint folder on the server"):
                await engine.update_weights({"w": 0}, 4)
            with pytest.raises(ConfigError, match="does not follow 3"):
                await engine.update_weights(tmp_path, 2)
            after_refusals = await engine.generate(PROMPT, SamplingParams(max_tokens=4), "v3-2")
        finally:
            await engine.close()
        info = (await call("GET", f"{url}/get_model_info")).json()
    assert isinstance(engine, WeightSync)
    assert result.policy_versions == [3] * 4 and engine.policy_version == 3
    assert after_refusals.policy_versions == [3] * 4  # refusals left it serving, unpaused
    assert info["weight_version"] == "3"


async def test_keep_needs_pause_modes_and_names_the_release() -> None:
    with sglang_server(SGLangSimConfig(version="0.5.5"), output_len=4) as url:
        engine = SGLangEngine(url)
        try:
            with pytest.raises(EngineError, match=r"SGLang >= 0\.5\.6.*runs SGLang 0\.5\.5"):
                await engine.pause("keep")
            await engine.pause("abort")
            await engine.resume()
            result = await engine.generate(PROMPT, SamplingParams(max_tokens=4), "old-1")
        finally:
            await engine.close()
    assert result.finish_reason == "stop"


async def test_an_api_key_comes_from_the_spec_or_the_environment_and_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sampling = SamplingParams(max_tokens=4)
    options = SGLangSimConfig(api_key="s3cret", health_poll_s=0.01)
    with sglang_server(options, output_len=4) as url:
        assert (await call("GET", f"{url}/get_model_info")).status_code == 401
        assert (await call("GET", f"{url}/health")).status_code == 200  # open, as in SGLang
        host = url.removeprefix("http://")
        keyless = SGLangEngine(url)
        with pytest.raises(ConfigError, match="API key"):
            await keyless.generate(PROMPT, sampling, "no-key-1")
        await keyless.close()
        by_spec = engine_from_spec(f"sglang://{host}?api_key=s3cret")
        monkeypatch.setenv("ROLLWAY_ENGINE_API_KEY", "s3cret")
        by_env = engine_from_spec(f"sglang://{host}")
        for engine, rid in ((by_spec, "spec-1"), (by_env, "env-1")):
            assert isinstance(engine, SGLangEngine)
            assert (await engine.generate(PROMPT, sampling, rid)).finish_reason == "stop"
            await engine.close()
    with pytest.raises(ConfigError) as refused:
        engine_from_spec(f"sglang://{host},{host}?api_key=s3cret")
    assert "s3cret" not in str(refused.value) and "api_key=***" in str(refused.value)


async def test_aborting_a_request_leaves_those_whose_ids_it_prefixes_running() -> None:
    # SGLang aborts every rid that starts with the one given: a-1 would take a-12 with it.
    with sglang_server(latency_s=30.0) as url:
        engine = SGLangEngine(url)
        try:
            calls = {
                rid: asyncio.create_task(engine.generate(PROMPT, SamplingParams(), rid))
                for rid in ("a-1", "a-12", "a-1.1")
            }
            await until_in_flight(url, 3)
            await engine.abort("a-1")
            assert (await calls["a-1"]).finish_reason == "abort"
            raw = (await call("GET", f"{url}/rollway/stats")).json()
            assert sorted(raw["in_flight"]) == ["a-1.1~", "a-12~"]  # the rid on the wire
            for rid in ("a-12", "a-1.1"):
                await engine.abort(rid)
                assert (await calls[rid]).finish_reason == "abort"
        finally:
            await engine.close()


@pytest.mark.parametrize("incremental", [False, True])
async def test_top_logprobs_are_asked_with_top_logprobs_num_plain_and_streamed(
    incremental: bool,
) -> None:
    sampling = SamplingParams(max_tokens=6, seed=5, top_logprobs=2)
    options = SGLangSimConfig(incremental_streaming_output=incremental)
    with sglang_server(options, output_len=6) as url:
        engine = SGLangEngine(url)
        try:
            plain = await engine.generate(PROMPT, sampling, "top-1")
            chunks = [c async for c in engine.generate_stream(PROMPT, sampling, "top-2")]
            bare = await engine.generate(PROMPT, sampling.replace(top_logprobs=0), "top-3")
        finally:
            await engine.close()
    assert plain.top_ids is not None and plain.top_logprobs is not None
    # The simulated server puts the sampled token first, then lesser made-up ones.
    assert [ids[0] for ids in plain.top_ids] == plain.output_ids
    assert [values[0] for values in plain.top_logprobs] == plain.logprobs
    assert all(len(ids) == 2 for ids in plain.top_ids)
    assert [ids for c in chunks for ids in c.top_ids or []] == plain.top_ids
    assert bare.top_ids is None and bare.top_logprobs is None
