"""``ctx.chat`` answers a ``ChatResult`` holding what the recorded turn holds (its ids, logprobs
and index), whether the gateway is in process or reached over HTTP as on an agent server."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollway.agents import RolloutContext
from rollway.gateway import create_app
from rollway.gateway.handle import LocalGateway
from rollway.gateway.remote_gateway import HttpChat
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import ChatResult
from rollway.trajectory import Trajectory
from rollway.web.background_server import BackgroundServer
from rollway.web.http_client import new_session
from tests.conftest import Served, sim_gateway


@pytest.fixture
def sim_over_http(renderer: ChatRenderer) -> Iterator[Served]:
    gateway = sim_gateway(renderer, output_len=6)
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        yield Served(url, admin_key, gateway)


async def chat_twice(ctx: RolloutContext) -> list[ChatResult]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    first = await ctx.chat(messages, max_tokens=4)  # cuts the sim's 6 ids: 'length'
    messages += [first.message, {"role": "user", "content": "again"}]
    second = await ctx.chat(messages)
    return [first, second]


def assert_answers_are_the_turns(answers: list[ChatResult], trajectory: Trajectory) -> None:
    assert [a.finish_reason for a in answers] == ["length", "stop"]
    assert [a.turn_index for a in answers] == [0, 1]
    for index, (answer, turn) in enumerate(zip(answers, trajectory.turns, strict=True)):
        prompt = trajectory.prompt_ids(index)
        assert answer.completion_ids == turn.completion_ids
        assert answer.logprobs == turn.logprobs
        assert answer.completion_tokens == len(turn.completion_ids) > 0
        assert answer.prompt_tokens == len(prompt)
        assert answer.usage["total_tokens"] == len(prompt) + len(turn.completion_ids)
        assert answer.content == turn.content and answer.tool_calls == turn.tool_calls
    # A turn cut before the last, after which the rollout went on: it is not truncated.
    assert not trajectory.is_truncated and trajectory.truncation_reason is None


async def test_in_process_ctx_chat_returns_the_recorded_ids_and_logprobs(
    renderer: ChatRenderer,
) -> None:
    gateway = sim_gateway(renderer, output_len=6)
    gateway.register("r", {})
    ctx = RolloutContext({}, [], "r", LocalGateway(gateway))
    answers = await chat_twice(ctx)
    assert_answers_are_the_turns(answers, await gateway.trajectory("r"))


async def test_ctx_chat_over_http_returns_the_recorded_ids_and_logprobs(
    sim_over_http: Served,
) -> None:
    """The agent-server path: ``HttpChat`` to the gateway's chat-completions route."""
    base = f"{sim_over_http.url}/v1/rollouts/r"
    headers = sim_over_http.admin_headers
    async with httpx.AsyncClient(headers=headers) as admin:
        key = (await admin.post(f"{base}/register", json={})).json()["api_key"]
        async with new_session() as session:
            ctx = RolloutContext({}, [], "r", HttpChat(session, base, key, "sim"))
            answers = await chat_twice(ctx)
        trajectory = Trajectory.model_validate((await admin.get(f"{base}/trajectory")).json())
    assert_answers_are_the_turns(answers, trajectory)
