"""The openai SDK's Responses API (plain, streaming, tools, previous_response_id)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import openai
import pytest

from rollway.gateway.http.responses_api import ResponsesRequest
from tests.conftest import Closing, Served

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


def call_items(call_id: str, a: int, b: int, result: str) -> list[dict[str, Any]]:
    arguments = json.dumps({"a": a, "b": b})
    return [
        {"type": "function_call", "call_id": call_id, "name": "add", "arguments": arguments},
        {"type": "function_call_output", "call_id": call_id, "output": result},
    ]


FEW_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 3 + 4?"},
    *call_items("call_0", 3, 4, "7"),
    {"role": "assistant", "content": "The answer is 7."},
    {"role": "user", "content": "What is 10 + 5?"},
    *call_items("call_1", 10, 5, "15"),
    {"role": "assistant", "content": "The answer is 15."},
    {"role": "user", "content": "What is 17 + 25?"},
]


def client_for(served: Served, closing: Closing, **body: Any) -> tuple[openai.OpenAI, str]:
    rollout_id = f"resp-{uuid.uuid4().hex[:8]}"
    url = f"{served.url}/v1/rollouts/{rollout_id}/register"
    reg = httpx.post(url, json=body, headers=served.admin_headers).json()
    client = openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    return closing(client), rollout_id


def trajectory(served: Served, rollout_id: str) -> dict[str, Any]:
    """The trajectory with each turn's whole prompt (``prompt_ids``)."""
    url = f"{served.url}/v1/rollouts/{rollout_id}/trajectory?whole_prompts=true"
    return httpx.get(url, headers=served.admin_headers).json()


def test_a_tool_loop_with_previous_response_id_is_one_exact_segment(
    served: Served, closing: Closing
) -> None:
    client, rollout_id = client_for(served, closing, temperature=0.7, seed=1)
    first = client.responses.create(model="m", input=FEW_SHOT, tools=[ADD], max_output_tokens=48)
    calls = [item for item in first.output if item.type == "function_call"]
    follow: list[dict[str, Any]] = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls
    ] or [{"role": "user", "content": "Check that with the add tool."}]
    second = client.responses.create(
        model="m", input=follow, previous_response_id=first.id, tools=[ADD], max_output_tokens=48
    )
    recorded = trajectory(served, rollout_id)
    assert recorded["segment_count"] == 1 and len(recorded["turns"]) == 2
    turn0, turn1 = recorded["turns"]
    assert first.usage.output_tokens == len(turn0["completion_ids"])
    assert second.usage.output_tokens == len(turn1["completion_ids"])
    prefix = turn0["prompt_ids"] + turn0["completion_ids"]
    assert turn1["prompt_ids"][: len(prefix)] == prefix
    assert [c.name for c in calls] == [c["function"]["name"] for c in turn0["tool_calls"]]


def test_streaming_rebuilds_the_recorded_answer(served: Served, closing: Closing) -> None:
    client, rollout_id = client_for(served, closing, temperature=0.7, seed=1)
    with client.responses.stream(
        model="m", input=FEW_SHOT, tools=[ADD], max_output_tokens=48
    ) as stream:
        final = stream.get_final_response()
    turn = trajectory(served, rollout_id)["turns"][0]
    assert final.output_text == (turn["content"] or "")
    names = [item.name for item in final.output if item.type == "function_call"]
    assert names == [c["function"]["name"] for c in turn["tool_calls"]]


def test_unknown_previous_response_and_bad_items_are_422(served: Served, closing: Closing) -> None:
    client, _ = client_for(served, closing)
    with pytest.raises(openai.UnprocessableEntityError, match="previous_response_id"):
        client.responses.create(model="m", input="hi", previous_response_id="resp_nope")
    with pytest.raises(openai.UnprocessableEntityError, match="not supported"):
        client.responses.create(
            model="m", input=[{"type": "web_search_call", "id": "ws_1", "status": "completed"}]
        )


def test_a_call_item_after_the_history_leaves_the_recorded_answer_as_it_was() -> None:
    """A function_call item joins the assistant turn before it; when that turn is the history of
    previous_response_id (the rollout's own record), the record must not change."""
    recorded_call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    history = [
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": None, "tool_calls": [recorded_call]},
    ]
    before = json.dumps(history)
    item = {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 1}'}
    chat = ResponsesRequest.model_validate({"input": [item]}).to_chat(history)
    assert json.dumps(history) == before
    assert [c["id"] for c in chat["messages"][-1]["tool_calls"]] == ["c1", "c2"]


@pytest.mark.parametrize("stream", [False, True])
def test_top_logprobs_come_back_in_the_output_text_as_openai_sends_them(
    served: Served, closing: Closing, stream: bool
) -> None:
    client, rollout_id = client_for(served, closing, temperature=0.7, seed=2)
    ask: dict[str, Any] = {
        "model": "m", "input": "Say hi.", "max_output_tokens": 6, "top_logprobs": 3,
        "include": ["message.output_text.logprobs"],
    }  # fmt: skip
    if stream:
        with client.responses.stream(**ask) as events:
            done = [e for e in events if e.type == "response.output_text.done"]
            final = events.get_final_response()
        assert [entry.logprob for entry in done[0].logprobs] == [
            entry.logprob for entry in final.output[0].content[0].logprobs
        ]
    else:
        final = client.responses.create(**ask)
    (text,) = final.output[0].content
    turn = trajectory(served, rollout_id)["turns"][0]
    assert turn["sampling"]["top_logprobs"] == 3  # recorded, as chat's top_logprobs
    assert [entry.logprob for entry in text.logprobs] == turn["logprobs"]
    assert len(text.logprobs) == len(turn["completion_ids"]) == final.usage.output_tokens
    for entry, values in zip(text.logprobs, turn["distribution"]["top_logprobs"], strict=True):
        assert [top.logprob for top in entry.top_logprobs] == values
    assert b"".join(bytes(entry.bytes) for entry in text.logprobs).decode() == text.text


def test_logprobs_are_answered_only_where_include_asks(served: Served, closing: Closing) -> None:
    client, _ = client_for(served, closing, seed=2)
    plain = client.responses.create(model="m", input="Say hi.", max_output_tokens=4, top_logprobs=2)
    assert plain.output[0].content[0].logprobs == []
    for bad in (21, -1):
        with pytest.raises(openai.UnprocessableEntityError, match="top_logprobs"):
            client.responses.create(model="m", input="hi", top_logprobs=bad)
