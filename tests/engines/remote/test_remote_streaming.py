"""Streaming from SGLang and vLLM (``generate_stream``) against their simulators over loopback
HTTP: the chunks put back together are ``generate``'s answer, whichever way the server streams;
aborts, closed streams, errors inside the stream and dropped connections end it cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollway.engines.base import StreamingEngine
from rollway.engines.remote.connection import RemoteClient
from rollway.engines.remote.sglang import SGLangEngine
from rollway.engines.remote.sse import EventStream
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.sim import SimConfig
from rollway.engines.streaming import collect, stream_generation
from rollway.errors import EngineError
from rollway.generation import GenerationChunk, SamplingParams
from rollway.simulators.common import Fault
from rollway.simulators.sglang_server import SGLangSimConfig, create_app
from rollway.simulators.vllm_server import VLLMSimConfig, create_vllm_sim_app
from rollway.web.background_server import BackgroundServer
from tests.engines import by_request_id
from tests.engines.remote.checkpoints import write_checkpoint

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356]
SAMPLING = SamplingParams(max_tokens=12, seed=3, temperature=0.7)


@dataclass
class Served:
    url: str
    engine: SGLangEngine | VLLMEngine

    def stats(self) -> dict[str, Any]:
        return by_request_id(httpx.get(f"{self.url}/rollway/stats", timeout=30).json())

    async def idle(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"{self.url}/rollway/wait_idle", timeout=60)
        return by_request_id(answer.json())


#: (server, its options): SGLang's default (whole output in every event), SGLang with
#: --incremental-streaming-output, an SGLang older than 0.5.6 (no logprobs with an abort),
#: vLLM with weight labels (0.33) and without (0.32).
SERVERS = [
    ("sglang", {}),
    ("sglang", {"incremental_streaming_output": True}),
    ("sglang", {"version": "0.5.4"}),
    ("vllm", {}),
    ("vllm", {"version": "0.32.0"}),
]
EACH_SERVER = pytest.mark.parametrize(
    ("kind", "options"), SERVERS, ids=["sglang", "sglang-incr", "sglang-0.5.4", "vllm", "vllm-0.32"]
)


@contextmanager
def serve(
    kind: str,
    options: dict[str, Any],
    config: SimConfig,
    fault: Fault = "none",
    fault_count: int = 1 << 30,
) -> Iterator[Served]:
    if kind == "sglang":
        app = create_app(config, SGLangSimConfig(**options), fault=fault, fault_count=fault_count)
        make = SGLangEngine
    else:
        vllm_options = VLLMSimConfig(**{"dev_mode": True, **options})
        app = create_vllm_sim_app(config, vllm_options, fault=fault, fault_count=fault_count)
        make = VLLMEngine  # type: ignore[assignment]
    with BackgroundServer(app) as url:
        yield Served(url, make(url))


async def chunks_of(stream: AsyncIterator[GenerationChunk]) -> list[GenerationChunk]:
    return [chunk async for chunk in stream]


@EACH_SERVER
async def test_streamed_chunks_put_together_are_what_generate_returns(
    kind: str, options: dict[str, Any]
) -> None:
    with serve(kind, options, SimConfig(output_len=10, per_token_s=0.05)) as served:
        engine = served.engine
        try:
            assert isinstance(engine, StreamingEngine)
            stream = engine.generate_stream(PROMPT, SAMPLING, "streamed")
            first = await anext(stream)
            running_at_first = "streamed" in served.stats()["in_flight"]
            chunks = [first, *await chunks_of(stream)]
            whole = await engine.generate(PROMPT, SAMPLING, "whole")
        finally:
            await engine.close()
    assert running_at_first  # the first tokens came while the server was still generating
    assert len(chunks) == 10 and all(len(c.output_ids) == 1 for c in chunks)
    assert [c.finish_reason for c in chunks] == [None] * 9 + ["stop"]
    assert collect(chunks) == whole
    assert whole.policy_versions == [0] * 10 and len(whole.output_ids) == 10


async def test_a_long_stream_of_whole_outputs_is_not_held_to_a_line_limit() -> None:
    """SGLang's default stream repeats the whole output and its logprobs in every event: past
    a few thousand tokens one event is larger than aiohttp's 64 KiB line limit."""
    options = {"stream_interval": 1000}
    sampling = SamplingParams(max_tokens=3000, seed=1)
    with serve("sglang", options, SimConfig(output_len=3000)) as served:
        engine = served.engine
        try:
            chunks = await chunks_of(engine.generate_stream(PROMPT, sampling, "long"))
            whole = await engine.generate(PROMPT, sampling, "whole")
        finally:
            await engine.close()
    assert [len(c.output_ids) for c in chunks] == [1000, 1000, 1000]
    assert collect(chunks) == whole


async def test_versions_are_the_servers_labels_as_generate_reads_them(tmp_path: Path) -> None:
    with serve("sglang", {}, SimConfig(output_len=6)) as served:
        engine = served.engine
        try:
            await engine.update_weights(write_checkpoint(tmp_path), 4)  # type: ignore[union-attr]
            chunks = await chunks_of(engine.generate_stream(PROMPT, SAMPLING, "new"))
            whole = await engine.generate(PROMPT, SAMPLING, "whole")
        finally:
            await engine.close()
    assert collect(chunks) == whole and whole.policy_versions == [4] * 6


@EACH_SERVER
async def test_engine_abort_mid_stream_ends_it_with_abort_and_frees_the_server(
    kind: str, options: dict[str, Any]
) -> None:
    with serve(kind, options, SimConfig(output_len=200, per_token_s=0.02)) as served:
        engine = served.engine
        try:
            stream = engine.generate_stream(PROMPT, SamplingParams(max_tokens=200), "cut")
            chunks = [await anext(stream)]
            await engine.abort("cut")
            async with asyncio.timeout(10):
                chunks += await chunks_of(stream)
            after = await served.idle()
        finally:
            await engine.close()
    partial = collect(chunks)
    assert partial.finish_reason == "abort" and 1 <= len(partial.output_ids) < 200
    assert chunks[-1].finish_reason == "abort" and after["in_flight"] == []
    assert after["aborted"] == ["cut"] and after["generations"] == {"cut": 1}


@pytest.mark.parametrize(("kind", "options"), [SERVERS[0], SERVERS[3]], ids=["sglang", "vllm"])
async def test_closing_the_stream_early_aborts_the_request_at_once(
    kind: str, options: dict[str, Any]
) -> None:
    if kind == "sglang":  # SGLang's own abort of a closed stream is too late to pass this
        options = {"disconnect_abort_s": 120.0}
    with serve(kind, options, SimConfig(output_len=500, per_token_s=0.02)) as served:
        engine = served.engine
        try:
            taken: list[GenerationChunk] = []
            async with asyncio.timeout(10):
                async for chunk in stream_generation(engine, PROMPT, SamplingParams(), "left"):
                    taken.append(chunk)
                    break
                after = await served.idle()
        finally:
            await engine.close()
    assert len(taken) == 1 and taken[0].finish_reason is None
    assert after["in_flight"] == [] and after["aborted"] == ["left"]


@pytest.mark.parametrize("version", ["0.33.0", "0.32.0"])
async def test_a_pause_that_aborts_before_any_token_ends_the_stream_with_abort(
    version: str,
) -> None:
    """vLLM before 0.33 sends no last chunk for an abort that sampled nothing: just [DONE]."""
    with serve("vllm", {"version": version}, SimConfig(latency_s=30.0)) as served:
        engine = served.engine
        try:
            streaming = asyncio.create_task(
                chunks_of(engine.generate_stream(PROMPT, SAMPLING, "p"))
            )
            async with httpx.AsyncClient() as client:
                await client.get(f"{served.url}/rollway/wait_in_flight", timeout=30)
            await engine.pause("abort")  # type: ignore[union-attr]
            async with asyncio.timeout(10):
                chunks = await streaming
            await engine.resume()  # type: ignore[union-attr]
        finally:
            await engine.close()
    assert chunks == [GenerationChunk([], [], "abort", [], "raw_logprobs")]


async def test_a_request_refused_by_our_pause_inside_the_stream_runs_once_after_it(
    tmp_path: Path,
) -> None:
    """vLLM 0.33 refuses a request that reaches it during a pause; inside a stream the refusal
    is an error event in a 200 answer, and the engine sends it again after ``resume``."""
    options = {"race_pause": True}
    with serve("vllm", options, SimConfig(output_len=16)) as served:
        engine = served.engine
        assert isinstance(engine, VLLMEngine)
        try:
            await engine.server()
            racing = asyncio.create_task(chunks_of(engine.generate_stream(PROMPT, SAMPLING, "r")))
            await asyncio.sleep(0)  # it passes the engine's gate: sent before the pause
            await engine.pause("abort")
            await engine.update_weights(write_checkpoint(tmp_path), 2)
            await engine.resume()
            result = collect(await racing)
        finally:
            await engine.close()
        server = served.stats()
    assert result.finish_reason == "length" and result.policy_versions == [2] * 12
    assert server["generations"] == {"r": 1}


@pytest.mark.parametrize(
    ("kind", "options", "fault", "named"),
    [
        ("sglang", {}, "5xx", r"HTTP 503\): simulated overload"),
        ("vllm", {}, "5xx", "HTTP 503 ServiceUnavailableError: simulated overload"),
        ("vllm", {"errors": 1}, "none", "HTTP 500 InternalServerError: Internal server error"),
    ],
    ids=["sglang-scheduler-error", "vllm-error", "vllm-error-finish"],
)
async def test_a_server_error_mid_stream_is_an_engine_error_naming_it(
    kind: str, options: dict[str, Any], fault: Fault, named: str
) -> None:
    with serve(kind, options, SimConfig(output_len=8, per_token_s=0.01), fault, 1) as served:
        engine = served.engine
        try:
            taken: list[GenerationChunk] = []
            with pytest.raises(EngineError, match=f"mid-stream.*{named}"):
                async for chunk in engine.generate_stream(PROMPT, SAMPLING, "failing"):
                    taken.append(chunk)
            again = await chunks_of(engine.generate_stream(PROMPT, SAMPLING, "next"))
            after = await served.idle()
        finally:
            await engine.close()
    assert len(taken) == 7  # the tokens before the error came through
    assert again[-1].finish_reason == "stop"
    assert after["generations"] == {"failing": 1, "next": 1}  # never sent twice


async def test_an_error_event_from_sglangs_checks_is_an_engine_error() -> None:
    """A stream's checks fail inside the 200 answer: ``{"error": {"message"}}``, [DONE]."""
    options = {"context_length": 4}
    with serve("sglang", options, SimConfig()) as served:
        engine = served.engine
        try:
            with pytest.raises(EngineError, match="longer than the model's context length"):
                await chunks_of(engine.generate_stream(PROMPT, SAMPLING, "long-prompt"))
        finally:
            await engine.close()
        assert served.stats()["generations"] == {}


@EACH_SERVER
async def test_a_connection_dropped_mid_stream_is_an_engine_error_not_a_hang(
    kind: str, options: dict[str, Any]
) -> None:
    if kind == "sglang":  # the engine aborts it, long before SGLang's own abort would
        options = {**options, "disconnect_abort_s": 120.0}
    with serve(kind, options, SimConfig(output_len=50, per_token_s=0.02), "drop", 1) as served:
        engine = served.engine
        try:
            taken: list[GenerationChunk] = []
            async with asyncio.timeout(10):
                with pytest.raises(EngineError, match=r"without \[DONE\]|broke"):
                    async for chunk in engine.generate_stream(PROMPT, SAMPLING, "dropped"):
                        taken.append(chunk)
                after = await served.idle()
        finally:
            await engine.close()
    assert len(taken) == 1 and after["in_flight"] == [] and after["aborted"] == ["dropped"]
    assert after["generations"] == {"dropped": 1}


async def test_a_seed_on_an_sglang_too_old_for_it_names_the_field_in_a_stream() -> None:
    with serve("sglang", {"version": "0.4.9"}, SimConfig()) as served:
        engine = served.engine
        try:
            with pytest.raises(EngineError, match=r"sampling_seed \(SGLang >= 0\.5\.3\)"):
                await chunks_of(engine.generate_stream(PROMPT, SAMPLING, "seeded"))
        finally:
            await engine.close()
        assert served.stats()["generations"] == {}


@pytest.mark.parametrize(("kind", "options"), [SERVERS[0], SERVERS[3]], ids=["sglang", "vllm"])
async def test_a_stream_kept_across_a_weight_update_names_both_versions(
    kind: str, options: dict[str, Any], tmp_path: Path
) -> None:
    with serve(kind, options, SimConfig(output_len=30, per_token_s=0.02)) as served:
        engine = served.engine
        assert isinstance(engine, SGLangEngine | VLLMEngine)
        try:
            stream = engine.generate_stream(PROMPT, SamplingParams(max_tokens=30), "kept")
            chunks = [await anext(stream), await anext(stream)]
            await engine.pause("keep")
            await engine.update_weights(write_checkpoint(tmp_path), 1)
            await engine.resume()
            async with asyncio.timeout(10):
                chunks += await chunks_of(stream)
        finally:
            await engine.close()
    kept = collect(chunks)
    versions = kept.policy_versions or []
    assert kept.finish_reason == "stop" and len(versions) == 30
    assert versions[:2] == [0, 0] and versions[-1] == 1 and versions == sorted(versions)


async def test_events_split_anywhere_with_crlf_and_comments_read_whole() -> None:
    """Server-sent events may come in any pieces, end lines with CRLF and carry comments."""
    wire = b': keep-alive\r\n\r\ndata: {"a": 1}\r\n\r\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\n'

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(wire), 5):
            yield wire[at : at + 5]

    async def answer(request: Request) -> StreamingResponse:
        return StreamingResponse(pieces(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/", answer, methods=["POST"])])
    with BackgroundServer(app) as url:
        http = RemoteClient()
        try:
            stream = EventStream(http, url, {}, _nothing)
            events = [event async for event in stream.events()]
        finally:
            await http.close()
    assert events == [{"a": 1}, {"b": 2}]


async def _nothing() -> None:
    return None


async def test_a_garbled_sglang_event_is_an_engine_error_and_aborts_the_request() -> None:
    aborted: list[str] = []

    async def garbled() -> AsyncIterator[bytes]:
        yield b'data: {"meta_info": {"finish_reason": null}}\n\n'  # no logprobs
        await asyncio.Event().wait()  # and never a finish: only an abort ends it

    async def generate(request: Request) -> StreamingResponse:
        return StreamingResponse(garbled(), media_type="text/event-stream")

    async def abort(request: Request) -> Response:
        aborted.append((await request.json())["rid"])
        return Response()

    async def info(request: Request) -> JSONResponse:
        return JSONResponse({"version": "0.5.9"})

    routes = [
        Route("/generate", generate, methods=["POST"]),
        Route("/abort_request", abort, methods=["POST"]),
        Route("/get_server_info", info),
        Route("/v1/models", info),
    ]
    with BackgroundServer(Starlette(routes=routes)) as url:
        engine = SGLangEngine(url)
        try:
            async with asyncio.timeout(10):
                with pytest.raises(EngineError, match="malformed SGLang stream event"):
                    await chunks_of(engine.generate_stream(PROMPT, SAMPLING, "bad"))
        finally:
            await engine.close()
    assert aborted[-1] == "bad~"
