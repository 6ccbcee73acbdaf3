"""SGLang and vLLM engines against the simulated servers: exact transport and every fault."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from rollway.engines.remote.connection import RemoteClient
from rollway.engines.remote.sglang import SGLangEngine
from rollway.engines.remote.sglang_wire import parse_generate_response
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.remote.vllm_wire import parse_completion
from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import EngineConnectError, EngineError, RolloutClosedError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import SamplingParams
from rollway.retry import RetryPolicy
from rollway.simulators import Fault, Protocol, create_sim_server_app
from rollway.web.background_server import BackgroundServer
from tests.engines import by_request_id

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356]
SAMPLING = SamplingParams(max_tokens=8, seed=3)
PROTOCOLS = pytest.mark.parametrize("protocol", ["sglang", "vllm"])


@contextmanager
def sim_server(protocol: Protocol, fault: Fault = "none", **config: Any) -> Iterator[str]:
    app = create_sim_server_app(SimConfig(**config), protocol=protocol, fault=fault)
    with BackgroundServer(app) as url:
        yield url


def make_engine(protocol: Protocol, url: str, **kwargs: Any) -> SGLangEngine | VLLMEngine:
    return SGLangEngine(url, **kwargs) if protocol == "sglang" else VLLMEngine(url, **kwargs)


async def server_stats(url: str, wait: str = "stats") -> dict[str, Any]:
    """The server's counters; ``wait`` long-polls until something runs or nothing does."""
    async with httpx.AsyncClient() as client:
        return by_request_id((await client.get(f"{url}/rollway/{wait}", timeout=60)).json())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@PROTOCOLS
async def test_ids_and_logprobs_cross_the_wire_exactly(protocol: Protocol) -> None:
    with sim_server(protocol, output_len=8) as url:
        engine = make_engine(protocol, url)
        try:
            remote = await engine.generate(PROMPT, SAMPLING, "exact-1")
        finally:
            await engine.close()
        assert (await server_stats(url))["generations"] == {"exact-1": 1}
    local = await SimEngine(SimConfig(output_len=8)).generate(PROMPT, SAMPLING, "x")
    exact = (local.output_ids, local.logprobs, local.finish_reason, local.logprob_kind)
    assert (remote.output_ids, remote.logprobs, remote.finish_reason, remote.logprob_kind) == exact


@PROTOCOLS
async def test_connect_failure_is_retried_exactly_once(protocol: Protocol) -> None:
    engine = make_engine(protocol, f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(EngineConnectError, match="cannot connect"):
            await engine.generate(PROMPT, SAMPLING, "nobody-home")
    finally:
        await engine.close()
    assert engine.http.connect_failures == 2


@PROTOCOLS
async def test_a_request_that_connects_builds_no_retry_loop(
    protocol: Protocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connect retry loop (tenacity) is built only after a failed connect: built per
    request it cost tens of microseconds and ~30 objects in reference cycles, which a busy
    gateway pays for again in garbage collections."""
    loops: list[RetryPolicy] = []
    retrying = RetryPolicy.retrying

    def counted(policy: RetryPolicy, **hooks: Any) -> Any:
        loops.append(policy)
        return retrying(policy, **hooks)

    monkeypatch.setattr(RetryPolicy, "retrying", counted)
    with sim_server(protocol, output_len=4) as url:
        engine = make_engine(protocol, url)
        try:
            await engine.generate(PROMPT, SAMPLING, "first")  # after the probe's control calls
            loops.clear()
            for index in range(3):
                result = await engine.generate(PROMPT, SAMPLING, f"plain-{index}")
                assert len(result.output_ids) == 4
        finally:
            await engine.close()
    assert loops == []
    http = RemoteClient()
    try:
        with pytest.raises(EngineConnectError, match="cannot connect"):
            await http.send(f"http://127.0.0.1:{free_port()}/generate", {}, _nothing_to_abort)
    finally:
        await http.close()
    assert [policy.attempts for policy in loops] == [1]  # the one try left after the first
    assert http.connect_failures == 2


async def _nothing_to_abort() -> None:
    return None


@contextmanager
def never_accepting() -> Iterator[str]:
    """A listening socket whose accept queue is full: the kernel drops further SYNs, so a
    connect hangs, as with a host that is down or behind a black-holing firewall."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        fillers = [socket.socket() for _ in range(2)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
        try:
            yield "http://{}:{}".format(*listener.getsockname())
        finally:
            for filler in fillers:
                filler.close()


@PROTOCOLS
async def test_a_connect_that_hangs_is_a_connect_error_after_the_connect_timeout(
    protocol: Protocol,
) -> None:
    with never_accepting() as url:
        engine = make_engine(protocol, url, http=RemoteClient(connect_timeout_s=0.2))
        try:
            async with asyncio.timeout(10):
                with pytest.raises(EngineConnectError, match="Connection timeout"):
                    await engine.generate(PROMPT, SAMPLING, "black-holed")
        finally:
            await engine.close()
    assert engine.http.connect_failures == 2  # nothing was sent: retried once


@PROTOCOLS
@pytest.mark.parametrize("fault", ["5xx", "drop"])
async def test_a_request_that_reached_the_server_is_not_retried(
    protocol: Protocol, fault: Fault
) -> None:
    with sim_server(protocol, fault) as url:
        engine = make_engine(protocol, url)
        try:
            with pytest.raises(EngineError, match="failed after sending"):
                await engine.generate(PROMPT, SAMPLING, f"{fault}-1")
        finally:
            await engine.close()
        seen = await server_stats(url, "wait_idle")
    assert seen["generations"] == {f"{fault}-1": 1}  # exactly once
    assert seen["in_flight"] == []
    if protocol == "sglang":  # vLLM's abort is the dropped connection itself
        assert seen["aborted"] == [f"{fault}-1"]


@PROTOCOLS
async def test_cancelling_aborts_the_generation_on_the_server(protocol: Protocol) -> None:
    with sim_server(protocol, "hang") as url:
        engine = make_engine(protocol, url)
        try:
            task = asyncio.create_task(engine.generate(PROMPT, SAMPLING, "hung-1"))
            await server_stats(url, "wait_in_flight")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await engine.close()
        seen = await server_stats(url, "wait_idle")
    assert seen["aborted"] == ["hung-1"] and seen["in_flight"] == []
    assert seen["generations"] == {"hung-1": 1}


@PROTOCOLS
async def test_a_timeout_aborts_and_fails_the_turn(protocol: Protocol) -> None:
    with sim_server(protocol, "hang") as url:
        engine = make_engine(protocol, url, timeout_s=0.3)
        try:
            with pytest.raises(EngineError):
                await engine.generate(PROMPT, SAMPLING, "slow-1")
        finally:
            await engine.close()
        seen = await server_stats(url, "wait_idle")
    assert seen["aborted"] == ["slow-1"] and seen["in_flight"] == []


@PROTOCOLS
async def test_gateway_records_exact_turns_and_cancel_leaves_nothing_running(
    protocol: Protocol, renderer: ChatRenderer
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with sim_server(protocol, output_len=6) as url:
        gateway = Gateway(make_engine(protocol, url), renderer, model_name="sim")
        gateway.register("r", {"max_tokens": 6, "seed": 1})
        reply = await gateway.chat("r", {"messages": messages})
        turn = (await gateway.trajectory("r")).turns[0]
        assert (await server_stats(url))["generations"] == {turn.request_id: 1}
        assert reply.completion_ids == turn.completion_ids and len(turn.logprobs) == 6
        await gateway.engine.close()
    with sim_server(protocol, "hang") as url:
        gateway = Gateway(make_engine(protocol, url), renderer, model_name="sim")
        gateway.register("c", {})
        chat = asyncio.create_task(gateway.chat("c", {"messages": messages}))
        await server_stats(url, "wait_in_flight")
        await gateway.cancel("c")
        with pytest.raises(RolloutClosedError):
            await chat
        seen = await server_stats(url, "wait_idle")
        assert seen["in_flight"] == [] and seen["aborted"] == ["c-1"]
        assert (await gateway.trajectory("c")).turns[0].finish_reason == "abort"
        await gateway.engine.close()


def test_malformed_answers_are_engine_errors_naming_the_field() -> None:
    with pytest.raises(EngineError, match="output_token_logprobs"):
        parse_generate_response({"meta_info": {"finish_reason": {"type": "stop"}}})
    with pytest.raises(EngineError, match="disagree"):
        parse_generate_response(
            {
                "output_ids": [1, 2],
                "meta_info": {
                    "finish_reason": {"type": "stop"},
                    "output_token_logprobs": [[-0.1, 1, None], [-0.2, 3, None]],
                },
            }
        )
    with pytest.raises(EngineError, match="token_ids"):
        parse_completion({"choices": [{"logprobs": {"token_logprobs": []}}]})
    with pytest.raises(EngineError, match="differ in length"):
        choice = {"token_ids": [1], "logprobs": {"token_logprobs": []}, "finish_reason": "stop"}
        parse_completion({"choices": [choice]})


def test_fewer_top_logprobs_than_asked_are_engine_errors_naming_the_token() -> None:
    """A short row would be recorded as the head of the distribution when it is not."""
    tops = [{"token_id:1": -0.1, "token_id:2": -2.0}, {"token_id:3": -0.2}]
    choice = {
        "token_ids": [1, 3],
        "logprobs": {"token_logprobs": [-0.1, -0.2], "top_logprobs": tops},
        "finish_reason": "stop",
    }
    assert parse_completion({"choices": [choice]}, top=1).top_ids == [[1], [3]]
    with pytest.raises(EngineError, match="gave 1 top logprobs for token 1, not 2"):
        parse_completion({"choices": [choice]}, top=2)
    meta = {
        "finish_reason": {"type": "stop"},
        "output_token_logprobs": [[-0.1, 1, None]],
        "output_top_logprobs": [[[-0.1, 1, None]]],
    }
    body = {"output_ids": [1], "meta_info": meta}
    assert parse_generate_response(body, top=1).top_ids == [[1]]
    with pytest.raises(EngineError, match="gave 1 top logprobs for token 0, not 3"):
        parse_generate_response(body, top=3)


@PROTOCOLS
async def test_connections_idle_to_the_servers_limit_are_not_reused(protocol: Protocol) -> None:
    """A server closes a connection idle for its keep-alive (uvicorn: 5 s; 1 s here); a client
    that kept it longer would send a turn down a closing socket, and that turn would fail."""
    from rollway.web.uvicorn_server import ServerLimits

    assert RemoteClient().idle_close_s < ServerLimits().keep_alive_s
    app = create_sim_server_app(SimConfig(output_len=2), protocol=protocol)
    with BackgroundServer(app, limits=ServerLimits(keep_alive_s=1.0)) as url:
        engine = make_engine(protocol, url, http=RemoteClient(idle_close_s=0.6))
        try:
            # Idle for just under, at and just over the server's limit, where a reused
            # connection meets the server closing it.
            for round_, idle_s in enumerate((0.97, 0.99, 1.0, 1.01, 1.03, 0.98)):
                calls = [engine.generate(PROMPT, SAMPLING, f"idle-{round_}-{i}") for i in range(64)]
                results = await asyncio.gather(*calls)
                assert all(len(r.output_ids) == 2 for r in results)
                await asyncio.sleep(idle_s)
        finally:
            await engine.close()
