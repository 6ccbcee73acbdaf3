"""The vLLM engine against the simulated vLLM server (over loopback HTTP): vLLM's defaults and
version-dependent fields, and weight sync through its pause, reload and resume routes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

from rollway.engines import engine_from_spec
from rollway.engines.base import PauseMode, WeightSync
from rollway.engines.remote import vllm as vllm_module
from rollway.engines.remote.connection import RemoteClient
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.remote.vllm_wire import parse_completion
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError, EngineError
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import GenerationResult, SamplingParams
from rollway.simulators.vllm_server import VLLMSim, VLLMSimConfig, create_vllm_sim_app
from rollway.web.background_server import BackgroundServer

from .checkpoints import write_checkpoint
from .test_remote_engines import never_accepting
from .test_vllm_conformance import chat_once

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356]
SEEDED = SamplingParams(max_tokens=16, seed=3)  # the simulated output is 16 tokens


@contextmanager
def vllm(config: SimConfig | None = None, **options: Any) -> Iterator[tuple[str, VLLMSim]]:
    app = create_vllm_sim_app(config, VLLMSimConfig(**options))
    with BackgroundServer(app) as url:
        yield url, app.state.vllm


async def generate(url: str, sampling: SamplingParams, **engine: Any) -> GenerationResult:
    client = VLLMEngine(url, **engine)
    try:
        return await client.generate(PROMPT, sampling, "one")
    finally:
        await client.close()


async def test_an_unset_max_tokens_becomes_the_room_left_in_the_context() -> None:
    with vllm(SimConfig(output_len=64), max_model_len=40) as (url, server):
        async with httpx.AsyncClient() as raw:  # vLLM's own default: 16 tokens
            plain = {"prompt": PROMPT, "seed": 1, "return_token_ids": True}
            bare = await raw.post(f"{url}/v1/completions", json=plain)
        engine = VLLMEngine(url)
        try:
            capped = await engine.generate(PROMPT, SamplingParams(), "capped")
            assert engine.context_length == 40  # GET /v1/models max_model_len
        finally:
            await engine.close()
        asked = await generate(url, SamplingParams(max_tokens=20))
        given = await generate(url, SamplingParams(), context_length=10)
    assert bare.json()["choices"][0]["finish_reason"] == "length"
    assert len(bare.json()["choices"][0]["token_ids"]) == 16
    assert server.requests[1]["max_tokens"] == 40 - len(PROMPT)
    assert (len(capped.output_ids), capped.finish_reason) == (33, "length")
    assert (len(asked.output_ids), asked.finish_reason) == (20, "length")
    assert (len(given.output_ids), given.finish_reason) == (3, "length")


async def test_without_a_known_context_the_default_cap_is_sent() -> None:
    with vllm(SimConfig(output_len=64), max_model_len=None) as (url, server):
        result = await generate(url, SamplingParams(), default_max_tokens=50)
    assert server.requests[0]["max_tokens"] == 50
    assert (len(result.output_ids), result.finish_reason) == (50, "length")


async def test_a_prompt_that_fills_the_context_ends_with_length_unsent() -> None:
    with vllm(max_model_len=len(PROMPT)) as (url, server):
        result = await generate(url, SamplingParams())
    assert (result.output_ids, result.finish_reason, server.requests) == ([], "length", [])


async def test_the_logprob_kind_is_the_servers_logprobs_mode() -> None:
    warm = SamplingParams(max_tokens=8, seed=3, temperature=0.7)
    with vllm(logprobs_mode="processed_logprobs") as (url, _):
        processed = await generate(url, warm, logprobs_mode="processed_logprobs")
    with vllm() as (url, _):
        raw = await generate(url, warm)
    assert (raw.logprob_kind, processed.logprob_kind) == ("raw_logprobs", "processed_logprobs")
    assert raw.output_ids == processed.output_ids and raw.logprobs != processed.logprobs
    for mode in ("raw_logits", "processed_logits", "logprobs"):
        with pytest.raises(ConfigError, match="raw_logprobs") as refused:
            VLLMEngine("http://127.0.0.1:1", logprobs_mode=mode)
        assert refused.value.param == "logprobs_mode"


async def test_a_seed_is_sent_only_when_asked_and_unseeded_calls_differ() -> None:
    with vllm() as (url, server):
        seeded = [await generate(url, SEEDED) for _ in range(2)]
        free = [await generate(url, SamplingParams(max_tokens=8)) for _ in range(2)]
    assert [body.get("seed") for body in server.requests] == [3, 3, None, None]
    assert "seed" not in server.requests[2]
    assert seeded[0].output_ids == seeded[1].output_ids
    assert free[0].output_ids != free[1].output_ids


async def test_a_server_too_old_for_token_ids_is_named() -> None:
    old = r"vLLM >= 0\.10\.2 \(this server: 0\.10\.1\.1\)"
    with vllm(version="0.10.1.1") as (url, _), pytest.raises(EngineError, match=old):
        await generate(url, SEEDED)


async def test_an_error_finish_fails_the_request_with_vllms_message() -> None:
    with vllm(errors=1) as (url, server):
        engine = VLLMEngine(url)
        try:
            with pytest.raises(EngineError, match="Internal server error"):
                await engine.generate(PROMPT, SEEDED, "broken")
            again = await engine.generate(PROMPT, SEEDED, "fine")
        finally:
            await engine.close()
    assert again.finish_reason == "stop"
    assert dict(server.sim.state.generations) == {"broken": 1, "fine": 1}  # never retried


def test_finish_reasons_map_and_error_and_unknown_ones_fail() -> None:
    def body(finish: str, ids: list[int], **extra: Any) -> dict[str, Any]:
        lps = [-0.5] * len(ids)
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": finish}
        return {"choices": [choice | extra]}

    partial = parse_completion(body("abort", [5, 6]), stamp=4)
    assert (partial.output_ids, partial.finish_reason, partial.policy_versions) == (
        [5, 6],
        "abort",
        [4, 4],
    )
    assert parse_completion(body("repetition", [5])).finish_reason == "stop"
    with pytest.raises(EngineError, match="finish_reason 'error'"):
        parse_completion(body("error", [5]))
    with pytest.raises(EngineError, match="unknown finish_reason 'weird'"):
        parse_completion(body("weird", [5]))
    spans = [{"version": "default", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 3}]
    split = parse_completion(body("stop", [5, 6, 7], weight_versions=spans), stamp=9)
    assert split.policy_versions == [0, 3, 3]
    with pytest.raises(EngineError, match="do not cover"):
        parse_completion(body("stop", [5, 6, 7, 8], weight_versions=spans))


async def test_health_is_a_short_get_and_true_while_paused() -> None:
    with vllm(dev_mode=True) as (url, _):
        engine = VLLMEngine(url)
        try:
            await engine.pause("abort")
            assert await engine.health()
        finally:
            await engine.close()
    with never_accepting() as dark:
        engine = VLLMEngine(dark, health_timeout_s=0.2)
        try:
            async with asyncio.timeout(3):
                assert not await engine.health()
        finally:
            await engine.close()


async def test_without_dev_mode_weight_sync_says_to_set_it(tmp_path: Path) -> None:
    with vllm() as (url, _):
        engine = VLLMEngine(url)
        try:
            with pytest.raises(ConfigError, match="VLLM_SERVER_DEV_MODE=1"):
                await engine.pause("abort")
            with pytest.raises(ConfigError, match="VLLM_SERVER_DEV_MODE=1"):
                await engine.update_weights(write_checkpoint(tmp_path), 1)
            assert (await engine.generate(PROMPT, SEEDED, "after")).finish_reason == "stop"
        finally:
            await engine.close()


@pytest.mark.parametrize(
    ("version", "modes"),
    [("0.14.0", set()), ("0.32.0", {"abort", "drain"}), ("0.33.0", {"abort", "drain", "keep"})],
)
async def test_pause_modes_are_exactly_what_the_server_supports(
    version: str, modes: set[str]
) -> None:
    with vllm(version=version, dev_mode=True) as (url, _):
        engine = VLLMEngine(url)
        try:
            assert isinstance(engine, WeightSync)
            await engine.server()
            assert engine.pause_modes == modes
            if "keep" not in modes:
                with pytest.raises(ConfigError, match=r"vLLM >= 0\.(16|33)\.0"):
                    await engine.pause("keep")
            with pytest.raises(ConfigError, match=r"unknown pause mode|0\.16\.0"):
                await engine.pause("later")  # type: ignore[arg-type]
        finally:
            await engine.close()


async def test_weights_come_from_a_folder_and_versions_must_increase(tmp_path: Path) -> None:
    step_1, step_0 = write_checkpoint(tmp_path / "step-1"), write_checkpoint(tmp_path / "step-0")
    with vllm(SimConfig(latency_s=0.3), dev_mode=True) as (url, server):
        engine = VLLMEngine(url)
        try:
            running = asyncio.create_task(engine.generate(PROMPT, SEEDED, "old"))
            await asyncio.to_thread(httpx.get, f"{url}/rollway/wait_in_flight", timeout=30)
            await engine.update_weights(step_1, 1)  # drains "old" first
            new = await engine.generate(PROMPT, SEEDED, "new")
            with pytest.raises(ConfigError, match="does not follow 1"):
                await engine.update_weights(step_0, 1)
            with pytest.raises(ConfigError, match="checkpoint folder"):
                await engine.update_weights({"w": 1}, 2)
        finally:
            await engine.close()
    old = running.result()
    assert old.finish_reason == "stop" and set(old.policy_versions or []) == {0}
    assert set(new.policy_versions or []) == {1} and engine.policy_version == 1
    assert server.loaded == [str(step_1)] and server.labels == ["default", "1"]
    assert server.paused is None and server.cache_resets == 2  # at the pause, after the load


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
async def test_a_client_adopts_weights_another_loaded_without_loading_them(
    tmp_path: Path, version: str
) -> None:
    """Two clients of one server (gateway workers): one loads, the other adopts the version;
    the server loads once, and the adopter's tokens carry the version (its label check, on
    servers that label, passes)."""
    step_1 = write_checkpoint(tmp_path / "step-1")
    with vllm(dev_mode=True, version=version) as (url, server):
        loader, adopter = VLLMEngine(url), VLLMEngine(url)
        try:
            await loader.update_weights(step_1, 1)
            await adopter.adopt_weights(step_1, 1)
            with pytest.raises(ConfigError, match="does not follow 1"):
                await adopter.adopt_weights(step_1, 1)
            adopted = await adopter.generate(PROMPT, SEEDED, "adopted")
        finally:
            await loader.close()
            await adopter.close()
    assert server.loaded == [str(step_1)]
    assert adopted.policy_versions == [1] * 16 and adopter.policy_version == 1


async def turn(engine: VLLMEngine, rid: str) -> tuple[GenerationResult, int]:
    """One turn as the gateway runs it: a turn the engine aborted is sent again (new id)."""
    for attempt in range(5):
        result = await engine.generate(PROMPT, SEEDED, f"{rid}-{attempt}")
        if result.finish_reason != "abort":
            return result, attempt
    raise AssertionError(f"{rid} aborted 5 times")


CASES = [
    ("0.33.0", "abort"),
    ("0.33.0", "drain"),
    ("0.33.0", "keep"),
    ("0.32.0", "abort"),
    ("0.32.0", "drain"),
]


@pytest.mark.parametrize(("version", "mode"), CASES)
async def test_a_paused_update_loses_no_turn_and_runs_no_request_twice(
    version: str, mode: PauseMode, tmp_path: Path
) -> None:
    folder = write_checkpoint(tmp_path / mode)
    with vllm(SimConfig(latency_s=0.6), version=version, dev_mode=True) as (url, server):
        engine = VLLMEngine(url)
        try:
            early = [asyncio.create_task(turn(engine, f"early{i}")) for i in range(4)]
            await asyncio.to_thread(httpx.get, f"{url}/rollway/wait_in_flight", timeout=30)
            if mode == "keep":
                await asyncio.sleep(0.15)  # let the early turns sample part of their tokens
            await engine.pause(mode)
            late = [asyncio.create_task(turn(engine, f"late{i}")) for i in range(3)]
            await engine.update_weights(folder, 1)
            await engine.resume()
            done_early = await asyncio.gather(*early)
            done_late = await asyncio.gather(*late)
        finally:
            await engine.close()
    counts = dict(server.sim.state.generations)
    assert all(count == 1 for count in counts.values())
    assert not [rid for rid in counts if rid.startswith("late") and not rid.endswith("-0")]
    for result, _ in done_early + done_late:
        assert result.finish_reason == "stop" and len(result.policy_versions or []) == 16
    assert all(r.policy_versions == [1] * 16 for r, _ in done_late)
    early_versions = [r.policy_versions or [] for r, _ in done_early]
    if mode == "abort":  # cut off, sent again under the new weights
        assert [tries for _, tries in done_early] == [1] * 4
        assert early_versions == [[1] * 16] * 4
    elif mode == "drain":  # finished under the old weights first
        assert early_versions == [[0] * 16] * 4
    else:  # frozen, then finished under the new weights
        assert all(v[0] == 0 and v[-1] == 1 and v == sorted(v) for v in early_versions)
    assert server.loaded == [str(folder)]


@pytest.mark.parametrize("version", ["0.33.0", "0.32.0"])
async def test_a_request_that_meets_the_pause_on_the_server_runs_once_after_it(
    version: str, tmp_path: Path
) -> None:
    with vllm(version=version, dev_mode=True, race_pause=True) as (url, server):
        engine = VLLMEngine(url)
        try:
            await engine.server()
            racing = asyncio.create_task(engine.generate(PROMPT, SEEDED, "racer"))
            await asyncio.sleep(0)  # it passes the engine's gate: sent before the pause
            await engine.pause("abort")
            await engine.update_weights(write_checkpoint(tmp_path), 2)
            await engine.resume()
            result = await racing
        finally:
            await engine.close()
    assert result.finish_reason == "stop" and result.policy_versions == [2] * 16
    assert dict(server.sim.state.generations) == {"racer": 1}
    assert server.refused == (["racer"] if version == "0.33.0" else [])


async def test_a_pause_by_another_client_fails_the_request_clearly() -> None:
    with vllm(dev_mode=True) as (url, _):
        async with httpx.AsyncClient() as other:
            await other.post(f"{url}/pause", params={"mode": "abort"})
        with pytest.raises(EngineError, match="paused by another client"):
            await generate(url, SEEDED)


async def test_an_abort_releases_a_turn_held_by_the_pause() -> None:
    with vllm(dev_mode=True) as (url, server):
        engine = VLLMEngine(url)
        try:
            await engine.pause("drain")
            held = asyncio.create_task(engine.generate(PROMPT, SEEDED, "held"))
            await asyncio.sleep(0)  # it reaches the engine's gate and waits there
            await engine.abort("held")
            result = await held
            await engine.resume()
        finally:
            await engine.close()
    assert result.finish_reason == "abort" and server.requests == []


async def test_a_repeatable_call_goes_again_on_the_connection_vllm_closed_after_a_500(
    tmp_path: Path,
) -> None:
    """vLLM (uvicorn) closes the connection after an unhandled error's 500 without saying so:
    a resume (safe to repeat) sent on it next is tried again; a weight load is not."""
    with vllm(dev_mode=True) as (url, _):
        http = RemoteClient()
        try:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}}
            refused = await http.call("POST", f"{url}/collective_rpc", rpc)
            resumed = await http.call("POST", f"{url}/resume", repeatable=True)
            await http.call("POST", f"{url}/collective_rpc", rpc)
            with pytest.raises(EngineError, match=r"Server disconnected|Connection reset"):
                await http.call("POST", f"{url}/resume")
        finally:
            await http.close()
    assert refused.status == 500 and "Cannot find any model weights" in refused.text
    assert resumed.ok


def skip_folder_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder only the server sees (a remote server): the engine cannot check it first."""
    monkeypatch.setattr(
        "rollway.engines.remote.vllm_weights.check_weights_folder", lambda *args: None
    )


async def test_a_reload_vllm_refuses_answers_its_cause_and_leaves_nothing_paused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    renderer: ChatRenderer,
) -> None:
    """Over the gateway, as a trainer pushes weights: the 502 names vLLM's cause, not the
    resume that follows on the connection vLLM closed; the gateway, the engine and the
    server agree nothing is paused, and the next turn runs."""
    skip_folder_check(monkeypatch)
    with vllm(dev_mode=True, model="smollm2") as (url, server):
        engine = VLLMEngine(url)
        gateway = Gateway(engine, renderer, model_name="smollm2")
        app = create_app(gateway, admin_key="ak", close_engine=True)
        with BackgroundServer(app) as gateway_url:
            async with httpx.AsyncClient(base_url=gateway_url, timeout=30) as http:
                admin = {"Authorization": "Bearer ak"}
                body = {"source": str(tmp_path)}
                answer = await http.post("/admin/weights", json=body, headers=admin)
                policy = (await http.get("/admin/policy", headers=admin)).json()
                gate_closed = engine._gate.closed
                chat = await chat_once(http, admin)
    assert answer.status_code == 502
    assert f"Cannot find any model weights with `{tmp_path}`" in answer.text
    assert (policy["paused"], policy["policy_version"], gate_closed) == (None, 0, False)
    assert server.paused is None and chat["choices"][0]["finish_reason"] == "length"  # 8 tokens
    failed = [r for r in caplog.records if "weight update to version 1 failed" in r.message]
    assert failed and "Cannot find any model weights" in failed[0].getMessage()


async def test_the_spec_declares_the_servers_logprobs_mode_and_context() -> None:
    with vllm(logprobs_mode="processed_logprobs") as (url, server):
        host = url.removeprefix("http://")
        spec = f"vllm://{host}?logprobs_mode=processed_logprobs&context_length=20"
        engine = engine_from_spec(spec)
        assert isinstance(engine, VLLMEngine)
        try:
            result = await engine.generate(PROMPT, SamplingParams(), "declared")
        finally:
            await engine.close()
    assert result.logprob_kind == "processed_logprobs"
    assert server.requests[0]["max_tokens"] == 20 - len(PROMPT)
    with pytest.raises(ConfigError, match="returns logits") as refused:
        engine_from_spec("vllm://127.0.0.1:1?logprobs_mode=raw_logits")
    assert refused.value.param == "logprobs_mode"


async def test_a_server_restarted_with_another_context_length_is_noticed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the server said of itself is asked again after ``SERVER_INFO_TTL_S``."""
    first = BackgroundServer(create_vllm_sim_app(None, VLLMSimConfig(max_model_len=4096)))
    url = first.start()
    engine = VLLMEngine(url)
    try:
        await engine.generate(PROMPT, SEEDED, "before")
        first.stop()
        port = int(url.rsplit(":", 1)[1])
        app = create_vllm_sim_app(None, VLLMSimConfig(max_model_len=1024))
        with BackgroundServer(app, port=port):
            assert (await engine.server()).max_model_len == 4096  # trusted for a while
            later = vllm_module._clock() + VLLMEngine.SERVER_INFO_TTL_S
            monkeypatch.setattr(vllm_module, "_clock", lambda: later)
            result = await engine.generate(PROMPT, SamplingParams(), "later")
            assert engine.context_length == 1024
    finally:
        await engine.close()
    assert result.finish_reason == "stop"


def tied_checkpoint(folder: Path, embedding: float, norm: float) -> Path:
    """A tied-embedding model's folder (config and two small tensors); returned."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"tie_word_embeddings": true}')
    tensors = {"model.embed_tokens.weight": torch.full((4, 2), embedding),
               "model.norm.weight": torch.full((2,), norm)}  # fmt: skip
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("device", ["cpu", "cuda"])
async def test_a_cpu_server_refuses_a_new_tied_embedding_it_would_not_use(
    tmp_path: Path, device: str
) -> None:
    """vLLM 0.32's CPU build packs the tied output layer once: after ``reload_weights`` it
    still computes logits with the old embedding (found by the GRPO loop on the real server,
    ratio 9e-3 off). A folder that changes the embedding is refused there, before vLLM is
    asked; one that changes other weights only is loaded; a GPU server takes both."""
    served = tied_checkpoint(tmp_path / "served", 1.0, 1.0)
    norm_only = tied_checkpoint(tmp_path / "norm-only", 1.0, 2.0)
    new_embedding = tied_checkpoint(tmp_path / "embedding", 1.5, 2.0)
    with vllm(dev_mode=True, root=str(served), device=device) as (url, server):
        engine = VLLMEngine(url)
        try:
            await engine.update_weights(norm_only, 1)
            if device == "cpu":
                with pytest.raises(ConfigError, match="token embedding") as refused:
                    await engine.update_weights(new_embedding, 2)
                assert refused.value.param == "source"
            else:
                await engine.update_weights(new_embedding, 2)
        finally:
            await engine.close()
    loaded = [str(norm_only)] + ([str(new_embedding)] if device == "cuda" else [])
    assert server.loaded == loaded and server.paused is None
