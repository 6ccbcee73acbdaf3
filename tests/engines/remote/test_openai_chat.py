"""A chat-level engine (any OpenAI-compatible API) behind the gateway: messages recorded,
no token ids, and the trajectory says so."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollway.engines import engine_from_spec
from rollway.engines.remote.openai_chat import OpenAIChatEngine, parse_chat_completion
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError, EngineError, RolloutClosedError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.simulators import Fault, create_sim_server_app
from rollway.web.background_server import BackgroundServer


@pytest.fixture
def chat_api() -> Iterator[Any]:
    def start(fault: Fault = "none") -> str:
        app = create_sim_server_app(SimConfig(output_len=5), protocol="openai", fault=fault)
        server = BackgroundServer(app)
        started.append(server)
        return f"{server.start()}/v1"

    started: list[BackgroundServer] = []
    yield start
    for server in started:
        server.stop()


async def stats(base_url: str, wait: str = "stats") -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        root = base_url.removesuffix("/v1")
        return (await client.get(f"{root}/rollway/{wait}", timeout=60)).json()


async def test_turns_are_recorded_as_messages_without_token_ids(
    chat_api: Any, renderer: ChatRenderer
) -> None:
    engine = OpenAIChatEngine(chat_api(), model="hosted-model")
    gateway = Gateway(engine, renderer, model_name="hosted-model")
    gateway.register("eval", {"max_tokens": 5})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    first = await gateway.chat("eval", {"messages": messages})
    messages += [first.message, {"role": "user", "content": "again"}]
    second = await gateway.chat("eval", {"messages": messages})
    trajectory = await gateway.trajectory("eval")
    await engine.close()
    assert first.message["content"].startswith("tok") and first.completion_tokens == 5
    assert second.prompt_tokens > 0
    assert trajectory.has_token_ids is False and trajectory.samples == []
    assert [len(t.logprobs) for t in trajectory.turns] == [5, 5]
    assert all(t.new_prompt_ids == [] and t.completion_ids == [] for t in trajectory.turns)
    assert trajectory.turns[1].prompt_len == second.prompt_tokens  # as the engine reported
    assert trajectory.messages[-1] == second.message
    # The answer has no ids to give (None, not an empty list) but the recorded logprobs.
    for answer, turn in zip((first, second), trajectory.turns, strict=True):
        assert answer.completion_ids is None and answer.turn_index == turn.index
        assert answer.logprobs == turn.logprobs


async def test_cancel_aborts_the_hosted_call(chat_api: Any, renderer: ChatRenderer) -> None:
    url = chat_api("hang")
    engine = OpenAIChatEngine(url, model="m")
    gateway = Gateway(engine, renderer, model_name="m")
    gateway.register("c", {})
    chat = asyncio.create_task(gateway.chat("c", {"messages": [{"role": "user", "content": "x"}]}))
    await stats(url, "wait_in_flight")
    await gateway.cancel("c")
    with pytest.raises(RolloutClosedError):
        await chat
    seen = await stats(url, "wait_idle")
    await engine.close()
    assert seen["in_flight"] == [] and len(seen["aborted"]) == 1
    assert (await gateway.trajectory("c")).turns[0].finish_reason == "abort"


async def test_a_failing_api_is_an_engine_error(chat_api: Any, renderer: ChatRenderer) -> None:
    engine = OpenAIChatEngine(chat_api("5xx"), model="m")
    gateway = Gateway(engine, renderer, model_name="m")
    gateway.register("f", {})
    with pytest.raises(EngineError):
        await gateway.chat("f", {"messages": [{"role": "user", "content": "x"}]})
    await engine.close()


def test_specs_and_malformed_answers() -> None:
    engine = engine_from_spec("openai://127.0.0.1:9/v2?model=m")
    assert isinstance(engine, OpenAIChatEngine) and engine.base_url == "http://127.0.0.1:9/v2"
    hosted = engine_from_spec("openai+https://api.example.com/v1?model=big")
    assert hosted.base_url == "https://api.example.com/v1" and hosted.model == "big"
    with pytest.raises(ConfigError, match="model"):
        engine_from_spec("openai://127.0.0.1:9")
    with pytest.raises(EngineError, match="choices"):
        parse_chat_completion({"usage": {}})
