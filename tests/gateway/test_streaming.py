"""Streamed turns: deltas reach the client as the engine samples, add up to the recorded
answer, and the recorded turn is the one the non-streamed path records; errors, cancels,
disconnects and weight updates mid-stream leave a consistent record."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from rollway.engines.sim import SimConfig, SimEngine
from rollway.engines.streaming import collect
from rollway.errors import RolloutClosedError
from rollway.events import TurnFinished, TurnStarted
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.turn_stream import ContentDelta, ToolCallDelta
from rollway.generation import ChatResult, GenerationChunk, GenerationResult, SamplingParams
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, FEW_SHOT, Closing, Served
from tests.gateway.test_http_openai_sdk import fetch_trajectory, register

QUESTION = [*FEW_SHOT, {"role": "user", "content": "What is 17 + 25?"}]
USER = [{"role": "user", "content": "hi"}]


class ScriptedEngine:
    """Streams the tokens of a given text one by one (optionally failing after some)."""

    def __init__(self, renderer: ChatRenderer, text: str, fail_after: int | None = None) -> None:
        self.ids = renderer.encode(text)
        self.fail_after = fail_after

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        for index, token_id in enumerate(self.ids):
            if index == self.fail_after:
                raise RuntimeError("the engine fell over")
            await asyncio.sleep(0)
            last = index == len(self.ids) - 1
            yield GenerationChunk([token_id], [-0.5], "stop" if last else None)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        return collect([c async for c in self.generate_stream(input_ids, sampling, request_id)])

    async def abort(self, request_id: str) -> None:
        pass

    async def close(self) -> None:
        pass


def serve(engine: object, renderer: ChatRenderer) -> Iterator[Served]:
    gateway = Gateway(engine, renderer, model_name="m")  # type: ignore[arg-type]
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        yield Served(url, admin_key, gateway)


@pytest.fixture
def paced(renderer: ChatRenderer) -> Iterator[Served]:
    yield from serve(SimEngine(SimConfig(per_token_s=0.02, output_len=30)), renderer)


def chat_client(registration: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=registration["base_url"], api_key=registration["api_key"], max_retries=0
    )


def stream_chat(client: openai.OpenAI, **body: Any) -> tuple[str, list[dict[str, Any]], Any]:
    """Content, tool calls (merged from their deltas) and the finishing chunk of a stream."""
    content, calls, last = "", {}, None
    with client.chat.completions.create(model="m", stream=True, **body) as stream:
        for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                calls[call.index] = call.model_dump(exclude_none=True, exclude={"index"})
            last = chunk
    return content, [calls[i] for i in sorted(calls)], last


# The same seed, streamed and not: the same recorded samples, on the real model.


def assert_same_samples(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Ids, masks and versions exactly; logprobs up to float noise: the engine's prefix cache
    makes even two plain calls differ in their last digits."""
    assert got["samples"] and len(got["samples"]) == len(want["samples"])
    for mine, theirs in zip(got["samples"], want["samples"], strict=True):
        for field in ("prompt_ids", "response_ids", "loss_mask", "policy_versions"):
            assert mine[field] == theirs[field], field
        assert mine["logprobs"] == pytest.approx(theirs["logprobs"], abs=1e-4)


def test_a_streamed_chat_completion_records_what_the_plain_one_records(
    served: Served, closing: Closing
) -> None:
    plain, streamed = (register(served, temperature=0.7, seed=3, max_tokens=48) for _ in "ab")
    answer = closing(chat_client(plain)).chat.completions.create(
        model="m", messages=QUESTION, tools=[ADD_TOOL]
    )
    content, calls, last = stream_chat(
        closing(chat_client(streamed)), messages=QUESTION, tools=[ADD_TOOL]
    )
    want, got = (
        fetch_trajectory(served, plain["rollout_id"], samples=True),
        fetch_trajectory(served, streamed["rollout_id"], samples=True),
    )
    assert_same_samples(got, want)
    (turn,) = got["turns"]
    assert content == (turn["content"] or "") == (answer.choices[0].message.content or "")
    assert [c["function"] for c in calls] == [c["function"] for c in turn["tool_calls"]]
    assert [c["id"] for c in calls] == [c["id"] for c in turn["tool_calls"]]
    assert last.choices[0].finish_reason == answer.choices[0].finish_reason


def test_a_streamed_message_records_what_the_plain_one_records(
    served: Served, closing: Closing
) -> None:
    plain, streamed = (register(served, temperature=0.7, seed=4) for _ in "ab")
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi!"}]}
    closing(
        anthropic.Anthropic(base_url=plain["base_url"], api_key=plain["api_key"])
    ).messages.create(**body)
    client = closing(
        anthropic.Anthropic(base_url=streamed["base_url"], api_key=streamed["api_key"])
    )
    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    want, got = (
        fetch_trajectory(served, plain["rollout_id"], samples=True),
        fetch_trajectory(served, streamed["rollout_id"], samples=True),
    )
    assert_same_samples(got, want)
    (turn,) = got["turns"]
    assert text == turn["content"] and final.usage.input_tokens == turn["prompt_len"]


def test_a_streamed_response_records_what_the_plain_one_records(
    served: Served, closing: Closing
) -> None:
    plain, streamed = (register(served, temperature=0.7, seed=5) for _ in "ab")
    body = {"model": "m", "input": "Say hello.", "max_output_tokens": 16}
    closing(chat_client(plain)).responses.create(**body)
    deltas = []
    with closing(chat_client(streamed)).responses.stream(**body) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    want, got = (
        fetch_trajectory(served, plain["rollout_id"], samples=True),
        fetch_trajectory(served, streamed["rollout_id"], samples=True),
    )
    assert_same_samples(got, want)
    (turn,) = got["turns"]
    assert "".join(deltas) == turn["content"] == final.output_text


# Pacing, text and tool calls over HTTP.


def test_the_first_content_reaches_the_client_long_before_the_last(
    paced: Served, closing: Closing
) -> None:
    registration = register(paced)
    client = closing(chat_client(registration))
    started, arrivals, content = time.monotonic(), [], ""
    with client.chat.completions.create(model="m", messages=USER, stream=True) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic() - started)
                content += chunk.choices[0].delta.content
    total = time.monotonic() - started
    assert len(arrivals) > 10  # the answer came in many pieces
    assert arrivals[0] < total / 3 and arrivals[-1] > total / 2
    (turn,) = fetch_trajectory(paced, registration["rollout_id"])["turns"]
    assert content == turn["content"] and len(turn["completion_ids"]) == 30


def test_tool_call_deltas_are_the_recorded_calls(renderer: ChatRenderer, closing: Closing) -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
    for served in serve(ScriptedEngine(renderer, f"Adding.\n{call}<|im_end|>"), renderer):
        registration = register(served)
        content, calls, last = stream_chat(
            closing(chat_client(registration)), messages=USER, tools=[ADD_TOOL]
        )
        (turn,) = fetch_trajectory(served, registration["rollout_id"])["turns"]
    assert content == turn["content"] == "Adding."
    assert calls == turn["tool_calls"] and calls[0]["function"]["name"] == "add"
    assert last.choices[0].finish_reason == "tool_calls"


def test_a_stop_string_never_reaches_the_client(renderer: ChatRenderer, closing: Closing) -> None:
    engine = ScriptedEngine(renderer, "alpha beta gamma delta epsilon")
    for served in serve(engine, renderer):
        registration = register(served)
        content, _, _ = stream_chat(
            closing(chat_client(registration)), messages=USER, stop=["gamma"]
        )
        (turn,) = fetch_trajectory(served, registration["rollout_id"])["turns"]
    assert content == turn["content"] == "alpha beta "


# Errors, cancels and disconnects.


def test_an_engine_failure_mid_stream_is_an_error_event_each_sdk_raises(
    renderer: ChatRenderer,
    closing: Closing,
) -> None:
    engine = ScriptedEngine(renderer, "one two three four five six", fail_after=4)
    for served in serve(engine, renderer):
        registration = register(served)
        shown = []
        openai_client = closing(chat_client(registration))
        with (
            pytest.raises(openai.APIError, match="engine failed"),
            openai_client.chat.completions.create(model="m", messages=USER, stream=True) as chat,
        ):
            for chunk in chat:
                shown.append(chunk.choices[0].delta.content)
        assert shown  # it failed after the stream began
        client = closing(
            anthropic.Anthropic(
                base_url=registration["base_url"], api_key=registration["api_key"], max_retries=0
            )
        )
        with (
            pytest.raises(anthropic.APIStatusError, match="engine failed"),
            client.messages.stream(model="m", max_tokens=8, messages=USER) as events,
        ):
            events.get_final_message()
        with (
            pytest.raises(openai.APIError, match="engine failed"),
            openai_client.responses.stream(model="m", input="x") as response,
        ):
            response.get_final_response()
        trajectory = fetch_trajectory(served, registration["rollout_id"])
    assert trajectory["turns"] == [] and len(trajectory["engine_errors"]) == 3


def test_an_error_before_the_first_piece_is_an_ordinary_http_error(
    paced: Served, closing: Closing
) -> None:
    registration = register(paced)
    httpx.post(f"{registration['base_url']}/cancel", headers=paced.admin_headers)
    with pytest.raises(openai.ConflictError):
        closing(chat_client(registration)).chat.completions.create(
            model="m", messages=USER, stream=True
        )


def test_a_client_that_goes_away_aborts_the_generation(
    renderer: ChatRenderer, closing: Closing
) -> None:
    engine = SimEngine(SimConfig(per_token_s=0.05, output_len=400))  # 20 s if left running
    for served in serve(engine, renderer):
        registration = register(served)
        with closing(chat_client(registration)).chat.completions.create(
            model="m", messages=USER, stream=True
        ) as stream:
            next(stream), next(stream)
            assert engine._running
        deadline = time.monotonic() + 5
        while engine._running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not engine._running
        state = served.gateway._rollouts[registration["rollout_id"]]
        assert not state.in_flight and not state.busy and state.turns == []


async def test_a_cancel_mid_stream_ends_the_turn_as_a_cancelled_one(
    renderer: ChatRenderer,
) -> None:
    gateway = Gateway(SimEngine(SimConfig(per_token_s=0.02, output_len=200)), renderer,
                      model_name="m")  # fmt: skip
    gateway.register("c", {})
    pieces = gateway.chat_stream("c", {"messages": USER})
    first = await anext(pieces)
    assert isinstance(first, ContentDelta)
    await gateway.cancel("c")
    with pytest.raises(RolloutClosedError):
        async for _ in pieces:
            pass
    trajectory = await gateway.trajectory("c")
    (turn,) = trajectory.turns
    assert trajectory.is_cancelled and turn.finish_reason == "abort"
    assert 0 < len(turn.completion_ids) < 200


# Weight updates, events, metrics.


async def test_an_update_mid_stream_continues_the_turn_and_records_both_versions(
    renderer: ChatRenderer,
) -> None:
    engine = SimEngine(SimConfig(per_token_s=0.02, output_len=24))
    gateway = Gateway(engine, renderer, model_name="m")
    gateway.register("w", {"max_tokens": 24})
    shown, before = "", None
    async for piece in gateway.chat_stream("w", {"messages": USER}):
        if isinstance(piece, ContentDelta):
            shown += piece.text
            if before is None and len(shown) > 8:
                before = list(gateway._rollouts["w"].in_flight)
                # From elsewhere, as a trainer would: the pause waits for this stream to end.
                update = asyncio.create_task(gateway.weights.update("ckpt-1", mode="abort"))
        elif isinstance(piece, ChatResult):
            answer = piece
    await update
    (turn,) = (await gateway.trajectory("w")).turns
    assert before == ["w-1"] and turn.request_id == "w-1.1" and turn.reissued == 1
    versions = turn.policy_versions or []
    assert len(turn.completion_ids) == len(turn.logprobs) == len(versions) == 24
    assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
    assert shown == turn.content == answer.message["content"]
    assert answer.completion_ids == turn.completion_ids
    assert gateway.metrics.turns_reissued._value.get() == 1


async def test_a_streamed_turn_is_heard_tracked_and_counted_like_a_plain_one(
    renderer: ChatRenderer,
) -> None:
    gateway = Gateway(SimEngine(SimConfig(per_token_s=0.01, output_len=12)), renderer,
                      model_name="m")  # fmt: skip
    heard: list[object] = []
    gateway.events.subscribe(heard.append)
    gateway.register("e", {})
    stuck = []
    async for piece in gateway.chat_stream("e", {"messages": USER}):
        if isinstance(piece, ContentDelta) and not stuck:
            stuck = gateway.stuck(0.0)
    assert [s.waiting_in for s in stuck] == ["engine"] and stuck[0].request_id == "e-1"
    started, finished = heard
    assert isinstance(started, TurnStarted) and isinstance(finished, TurnFinished)
    assert finished.completion_tokens == 12 and finished.finish_reason == "stop"
    assert gateway.metrics.tokens.labels("completion")._value.get() == 12
    assert gateway.metrics.turns.labels("stop")._value.get() == 1
    assert not gateway._rollouts["e"].busy and not gateway._rollouts["e"].in_flight


async def test_tool_call_pieces_come_after_the_content_and_before_the_result(
    renderer: ChatRenderer,
) -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    gateway = Gateway(ScriptedEngine(renderer, f"Sure.\n{call}"), renderer,  # type: ignore[arg-type]
                      model_name="m")  # fmt: skip
    gateway.register("t", {})
    tools = [ADD_TOOL]
    pieces = [p async for p in gateway.chat_stream("t", {"messages": USER, "tools": tools})]
    kinds = [type(p).__name__ for p in pieces]
    assert kinds[-2:] == ["ToolCallDelta", "ChatResult"] and "ContentDelta" in kinds[:-2]
    result = pieces[-1]
    assert isinstance(result, ChatResult) and isinstance(pieces[-2], ToolCallDelta)
    assert pieces[-2].call == result.message["tool_calls"][0]
    assert json.loads(pieces[-2].call["function"]["arguments"]) == {"a": 1, "b": 2}


async def test_a_streamed_call_past_max_turns_is_the_length_answer_in_one_piece(
    renderer: ChatRenderer,
) -> None:
    gateway = Gateway(SimEngine(SimConfig(output_len=4)), renderer, model_name="m")
    gateway.register("l", {"max_turns": 1})
    first = [p async for p in gateway.chat_stream("l", {"messages": USER})]
    again = [p async for p in gateway.chat_stream("l", {"messages": USER})]
    assert isinstance(first[-1], ChatResult) and first[-1].finish_reason == "stop"
    assert len(again) == 1 and isinstance(again[0], ChatResult)
    assert again[0].finish_reason == "length" and again[0].completion_ids == []
    trajectory = await gateway.trajectory("l")
    assert len(trajectory.turns) == 1 and trajectory.truncation_reason == "max_turns"


async def test_a_special_token_inside_an_answer_is_recorded_and_not_passed_off_as_text(
    renderer: ChatRenderer,
) -> None:
    """A policy that opens a turn of its own mid-answer (``<|im_start|>``, seen in a make rl
    run): the ids keep it, the turn says where it was, the content (streamed or not) leaves
    it out."""
    text = "sleep<|im_start|>user\nmore<|im_end|>"
    ids = renderer.encode(text)
    opening = ids.index(renderer.tokenizer.convert_tokens_to_ids("<|im_start|>"))
    answers = []
    for stream in (False, True):
        gateway = Gateway(ScriptedEngine(renderer, text), renderer, model_name="m")  # type: ignore[arg-type]
        gateway.register("r", {})
        if stream:
            pieces = [p async for p in gateway.chat_stream("r", {"messages": USER})]
            shown = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
            result = pieces[-1]
            assert isinstance(result, ChatResult) and shown == result.content
        else:
            result = await gateway.chat("r", {"messages": USER})
        (turn,) = (await gateway.trajectory("r")).turns
        assert turn.completion_ids == ids and turn.special_tokens_at == [opening]
        answers.append(result.content)
    assert answers == ["sleepuser\nmore"] * 2
