"""The SGLang engine against the simulated SGLang server: exact transport and every fault class."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from rollway.engines.sglang import SGLangEngine, parse_generate_response
from rollway.engines.sim import SimConfig, SimEngine
from rollway.engines.sim_server import Fault, create_sim_server_app
from rollway.errors import EngineError, RolloutClosedError
from rollway.gateway import BackgroundServer, ChatRenderer, Gateway
from rollway.types import SamplingParams

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356]
SAMPLING = SamplingParams(max_tokens=8, seed=3)


@contextmanager
def sim_server(fault: Fault = "none", **config: float) -> Iterator[str]:
    app = create_sim_server_app(SimConfig(**config), fault=fault)  # type: ignore[arg-type]
    with BackgroundServer(app) as url:
        yield url


def stats(url: str) -> dict:
    return httpx.get(f"{url}/rollway/stats").json()


async def wait_in_flight(url: str) -> None:
    """Long-polls the server until a generation is running."""
    async with httpx.AsyncClient() as client:
        seen = (await client.get(f"{url}/rollway/wait_in_flight", timeout=60)).json()
    assert seen["in_flight"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_ids_and_logprobs_cross_the_wire_exactly() -> None:
    with sim_server(output_len=8) as url:
        engine = SGLangEngine(url)
        try:
            remote = await engine.generate(PROMPT, SAMPLING, "exact-1")
        finally:
            await engine.close()
        assert stats(url)["generations"] == {"exact-1": 1}
    local = await SimEngine(SimConfig(output_len=8)).generate(PROMPT, SAMPLING, "x")
    assert remote == local


async def test_connect_failure_is_retried_exactly_once() -> None:
    engine = SGLangEngine(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(EngineError, match="cannot connect"):
            await engine.generate(PROMPT, SAMPLING, "nobody-home")
    finally:
        await engine.close()
    assert engine.http.connect_failures == 2


@pytest.mark.parametrize("fault", ["5xx", "drop"])
async def test_a_request_that_reached_the_server_is_never_retried_and_is_aborted(
    fault: Fault,
) -> None:
    with sim_server(fault) as url:
        engine = SGLangEngine(url)
        try:
            with pytest.raises(EngineError, match="failed after sending"):
                await engine.generate(PROMPT, SAMPLING, f"{fault}-1")
        finally:
            await engine.close()
        seen = stats(url)
    assert seen["generations"] == {f"{fault}-1": 1}  # exactly once
    assert seen["aborted"] == [f"{fault}-1"] and seen["in_flight"] == []


async def test_cancelling_aborts_the_generation_on_the_server() -> None:
    with sim_server("hang") as url:
        engine = SGLangEngine(url)
        try:
            task = asyncio.create_task(engine.generate(PROMPT, SAMPLING, "hung-1"))
            await wait_in_flight(url)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await engine.close()
        seen = stats(url)
    assert seen["aborted"] == ["hung-1"] and seen["in_flight"] == []
    assert seen["generations"] == {"hung-1": 1}


async def test_a_timeout_aborts_and_fails_the_turn() -> None:
    with sim_server("hang") as url:
        engine = SGLangEngine(url, timeout_s=0.3)
        try:
            with pytest.raises(EngineError):
                await engine.generate(PROMPT, SAMPLING, "slow-1")
        finally:
            await engine.close()
        seen = stats(url)
    assert seen["aborted"] == ["slow-1"] and seen["in_flight"] == []


async def test_gateway_over_sglang_records_exact_turns_and_cancel_aborts(
    renderer: ChatRenderer,
) -> None:
    with sim_server(output_len=6) as url:
        gateway = Gateway(SGLangEngine(url), renderer, model_name="sim")
        gateway.register("r", {"max_tokens": 6, "seed": 1})
        messages = [{"role": "user", "content": "hi"}]
        reply = await gateway.chat("r", {"messages": messages})
        turn = gateway.trajectory("r").turns[0]
        assert stats(url)["generations"] == {turn.request_id: 1}
        assert reply.completion_ids == turn.completion_ids and len(turn.logprobs) == 6
        await gateway.engine.close()
    with sim_server("hang") as url:
        gateway = Gateway(SGLangEngine(url), renderer, model_name="sim")
        gateway.register("c", {})
        chat = asyncio.create_task(gateway.chat("c", {"messages": messages}))
        await wait_in_flight(url)
        await gateway.cancel("c")
        with pytest.raises(RolloutClosedError):
            await chat
        assert stats(url)["in_flight"] == [] and stats(url)["aborted"] == ["c-1"]
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
