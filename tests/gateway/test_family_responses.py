"""Qwen3 through the OpenAI Responses API: the thinking comes back as ``reasoning`` items
(``reasoning_text`` content, streamed as ``response.reasoning_text.delta``), and a tool loop
whose output items are sent back as input, reasoning item or not, by the unmodified openai SDK
or the openai-agents SDK, is one exact sample."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from agents.items import ReasoningItem

from rollway.engines.scripted import ScriptedEngine
from rollway.gateway import Gateway
from rollway.gateway.http.responses_api import ResponsesRequest
from tests.conftest import Closing
from tests.gateway.test_families import (
    REASONING,
    check_one_exact_sample,
    qwen3_renderer,
    qwen3_tokenizer,
    served_qwen3,
)

__all__ = ["qwen3_renderer", "qwen3_tokenizer", "served_qwen3"]  # fixtures, to be found

Served = tuple[str, Gateway, ScriptedEngine]
#: What an agent sends back of an answer's output items.
Echo = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def as_output(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as the SDK returned them, reasoning items included."""
    return items


def reasoning_dropped(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for item in items if item["type"] != "reasoning"]


def call_outputs(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    outputs = []
    for item in items:
        if item["type"] == "function_call":
            arguments = json.loads(item["arguments"])
            total = str(arguments["a"] + arguments["b"])
            outputs.append(
                {"type": "function_call_output", "call_id": item["call_id"], "output": total}
            )
    return outputs


def streamed_response(client: openai.OpenAI, items: list[dict[str, Any]]) -> Any:
    """The SDK's stream helper (which checks each item's identity from added to completed);
    the reasoning streams as the tokens come, in one reasoning item before any text."""
    kinds = []
    with client.responses.stream(model="qwen3", input=items, tools=[ADD]) as stream:
        for event in stream:
            if event.type == "response.reasoning_text.delta":
                kinds.append("reasoning")
                assert event.output_index == 0 and event.item_id.startswith("rs_")
            elif event.type == "response.output_text.delta":
                kinds.append("text")
        final = stream.get_final_response()
    assert kinds.count("reasoning") > 1
    assert "text" not in kinds or kinds.index("text") > kinds.index("reasoning")
    assert kinds[kinds.count("reasoning") :] == ["text"] * kinds.count("text")
    return final


@pytest.mark.parametrize("echo", [as_output, reasoning_dropped])
@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_tool_loop_through_the_responses_api_is_one_sample_with_reasoning_items(
    served_qwen3: Served, closing: Closing, stream: bool, echo: Echo
) -> None:
    url, gateway, engine = served_qwen3
    registered = gateway.register("q1", {"max_tokens": 256})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/q1", api_key=registered.api_key))
    items: list[dict[str, Any]] = [{"role": "user", "content": "What is 1 + 2 + 3 + 4?"}]
    thoughts, texts = [], []
    for turns, follow_up in ((4, "And plus 5?"), (2, None)):
        for _ in range(turns):
            if stream:
                reply = streamed_response(client, items)
            else:
                reply = client.responses.create(model="qwen3", input=items, tools=[ADD])
            output = [item.model_dump(exclude_none=True) for item in reply.output]
            assert output[0]["type"] == "reasoning" and output[0]["summary"] == []
            thoughts += [part["text"] for part in output[0]["content"]]
            texts += [
                part["text"] for o in output if o["type"] == "message" for part in o["content"]
            ]
            items += [*echo(output), *call_outputs(output)]
        if follow_up:
            items.append({"role": "user", "content": follow_up})
    assert thoughts == REASONING
    assert texts == ["1 + 2 + 3 + 4 = 10.", "15."]
    trajectory = asyncio.run(gateway.trajectory("q1"))
    check_one_exact_sample(trajectory, engine, gateway.renderer.tokenizer)


def test_qwen3_tool_loop_with_previous_response_id_answers_reasoning_items(
    served_qwen3: Served, closing: Closing
) -> None:
    url, gateway, engine = served_qwen3
    registered = gateway.register("q1", {"max_tokens": 256})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/q1", api_key=registered.api_key))
    items: list[dict[str, Any]] = [{"role": "user", "content": "What is 1 + 2 + 3 + 4?"}]
    previous, thoughts = None, []
    for turns, follow_up in ((4, "And plus 5?"), (2, None)):
        for _ in range(turns):
            reply = client.responses.create(
                model="qwen3",
                input=items,
                tools=[ADD],
                previous_response_id=previous,
            )
            thoughts += [item.content[0].text for item in reply.output if item.type == "reasoning"]
            previous, items = reply.id, call_outputs([o.model_dump() for o in reply.output])
        if follow_up:
            items.append({"role": "user", "content": follow_up})
    assert thoughts == REASONING
    trajectory = asyncio.run(gateway.trajectory("q1"))
    check_one_exact_sample(trajectory, engine, gateway.renderer.tokenizer)


def test_one_answers_output_items_become_one_assistant_message() -> None:
    """Reasoning, text and calls of one answer are one assistant turn, as recorded; a
    reasoning item without ``content`` (a summary only) is an answer with its reasoning
    dropped; each new reasoning item starts a new answer."""
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    thought = {"content": [{"type": "reasoning_text", "text": "Add."}]}
    items = [
        {"role": "user", "content": "Add."},
        reasoning | thought,
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Sure."}],
        },
        call,
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        reasoning | {"summary": [{"type": "summary_text", "text": "a summary"}]},
        {"role": "assistant", "content": "3."},
    ]
    chat = ResponsesRequest.model_validate({"input": items}).to_chat([])
    function = {"name": "add", "arguments": "{}"}
    assert chat["messages"] == [
        {"role": "user", "content": "Add."},
        {
            "role": "assistant",
            "content": "Sure.",
            "reasoning_content": "Add.",
            "tool_calls": [{"id": "c1", "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "assistant", "content": "3."},
    ]


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_tool_loop_through_the_openai_agents_sdk_is_one_sample(
    served_qwen3: Served, stream: bool
) -> None:
    """An Agents SDK ``Runner`` sends each answer's output items back as input (its reasoning
    items included); a second question continues the first run's items."""
    url, gateway, engine = served_qwen3
    registered = gateway.register("q1", {"max_tokens": 256})

    sent: list[dict[str, Any]] = []

    async def keep(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    async def run() -> tuple[list[Any], list[str]]:
        http = httpx.AsyncClient(event_hooks={"request": [keep]})
        client = openai.AsyncOpenAI(
            base_url=f"{url}/v1/rollouts/q1", api_key=registered.api_key, http_client=http
        )
        model = OpenAIResponsesModel(model="qwen3", openai_client=client)
        agent = Agent(name="calculator", model=model, tools=[add])
        config = RunConfig(tracing_disabled=True)
        items: Any = "What is 1 + 2 + 3 + 4?"
        new_items, finals = [], []
        try:
            for follow_up in ("And plus 5?", None):
                if stream:
                    result: Any = Runner.run_streamed(agent, items, max_turns=6, run_config=config)
                    async for _ in result.stream_events():
                        pass
                else:
                    result = await Runner.run(agent, items, max_turns=6, run_config=config)
                new_items += result.new_items
                finals.append(result.final_output)
                items = [*result.to_input_list(), {"role": "user", "content": follow_up}]
        finally:
            await client.close()
        return new_items, finals

    new_items, finals = asyncio.run(run())
    assert finals == ["1 + 2 + 3 + 4 = 10.", "15."]
    reasoning = [item.raw_item for item in new_items if isinstance(item, ReasoningItem)]
    assert [item.content[0].text for item in reasoning] == REASONING
    # The SDK sent the reasoning items back, their text in ``content``.
    echoed = [
        item["content"][0]["text"]
        for item in sent[-1]["input"]
        if isinstance(item, dict) and item.get("type") == "reasoning"
    ]
    assert echoed == REASONING[:-1]
    trajectory = asyncio.run(gateway.trajectory("q1"))
    check_one_exact_sample(trajectory, engine, gateway.renderer.tokenizer)


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_inside_its_thinking_is_a_reasoning_item_alone(
    served_qwen3: Served, closing: Closing, stream: bool
) -> None:
    url, gateway, _ = served_qwen3
    registered = gateway.register("q1", {"max_tokens": 256})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/q1", api_key=registered.api_key))
    asked: dict[str, Any] = {"model": "qwen3", "input": "What is 1 + 2?", "max_output_tokens": 6}
    if stream:
        with client.responses.stream(**asked) as events:
            reply = events.get_final_response()
    else:
        reply = client.responses.create(**asked)
    assert reply.status == "incomplete" and [item.type for item in reply.output] == ["reasoning"]
    (item,) = reply.output
    assert item.type == "reasoning" and item.content is not None
    text = item.content[0].text
    assert text and REASONING[0].startswith(text) and text != REASONING[0]
