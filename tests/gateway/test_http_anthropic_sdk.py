"""The official anthropic SDK (plain, streaming, tools) against the gateway's Messages route."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import httpx
import pytest

from rollway.gateway.http.messages_request import MessagesRequest
from tests.conftest import Closing, Served

ADD = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def tool_use(use_id: str, a: int, b: int) -> dict[str, Any]:
    return {"type": "tool_use", "id": use_id, "name": "add", "input": {"a": a, "b": b}}


FEW_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": [tool_use("toolu_0", 3, 4)]},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "7"}],
    },
    {"role": "assistant", "content": "The answer is 7."},
    {"role": "user", "content": "What is 10 + 5?"},
    {"role": "assistant", "content": [tool_use("toolu_1", 10, 5)]},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "15"}],
    },
    {"role": "assistant", "content": "The answer is 15."},
    {"role": "user", "content": "What is 17 + 25?"},
]


def register(served: Served, **body: Any) -> dict[str, Any]:
    rollout_id = f"anth-{uuid.uuid4().hex[:8]}"
    url = f"{served.url}/v1/rollouts/{rollout_id}/register"
    return httpx.post(url, json=body, headers=served.admin_headers).json()


def trajectory(served: Served, rollout_id: str) -> dict[str, Any]:
    """The trajectory with each turn's whole prompt (``prompt_ids``)."""
    url = f"{served.url}/v1/rollouts/{rollout_id}/trajectory?whole_prompts=true"
    return httpx.get(url, headers=served.admin_headers).json()


def test_a_tool_conversation_through_the_anthropic_sdk_is_one_exact_segment(
    served: Served,
    closing: Closing,
) -> None:
    reg = register(served, temperature=0.7, seed=1)
    client = closing(anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"]))
    messages = list(FEW_SHOT)
    first = client.messages.create(model="m", max_tokens=48, messages=messages, tools=[ADD])
    blocks = [b.model_dump(exclude_none=True) for b in first.content]
    messages.append({"role": "assistant", "content": blocks})
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": "42"}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    messages.append({"role": "user", "content": results or "Check that with the add tool."})
    second = client.messages.create(model="m", max_tokens=48, messages=messages, tools=[ADD])
    recorded = trajectory(served, reg["rollout_id"])
    assert recorded["segment_count"] == 1 and len(recorded["turns"]) == 2
    turn0, turn1 = recorded["turns"]
    assert first.usage.output_tokens == len(turn0["completion_ids"])
    assert second.usage.output_tokens == len(turn1["completion_ids"])
    assert first.stop_reason == ("tool_use" if results else "end_turn")
    prefix = turn0["prompt_ids"] + turn0["completion_ids"]
    assert turn1["prompt_ids"][: len(prefix)] == prefix


def test_streaming_events_rebuild_the_recorded_answer(served: Served, closing: Closing) -> None:
    reg = register(served, temperature=0.7, seed=1)
    client = closing(anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"]))
    with client.messages.stream(model="m", max_tokens=48, messages=FEW_SHOT, tools=[ADD]) as stream:
        final = stream.get_final_message()
    turn = trajectory(served, reg["rollout_id"])["turns"][0]
    names = [b.name for b in final.content if b.type == "tool_use"]
    assert names == [c["function"]["name"] for c in turn["tool_calls"]]
    text = "".join(b.text for b in final.content if b.type == "text")
    assert text == (turn["content"] or "")
    assert final.usage.output_tokens == len(turn["completion_ids"])


def test_wrong_key_and_bad_bodies_get_anthropic_sdk_errors(
    served: Served, closing: Closing
) -> None:
    reg = register(served)
    wrong = closing(anthropic.Anthropic(base_url=reg["base_url"], api_key="nope", max_retries=0))
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    client = closing(
        anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    )
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\]\.type"):
        client.messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )


def test_tool_use_and_results_map_to_chat_messages() -> None:
    request = MessagesRequest.model_validate(
        {"max_tokens": 8, "system": "Be brief.", "messages": FEW_SHOT[:3], "tools": [ADD]}
    )
    chat = request.to_chat()
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    call = chat["messages"][2]["tool_calls"][0]
    assert call["id"] == "toolu_0" and call["function"]["arguments"] == '{"a": 3, "b": 4}'
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "toolu_0", "content": "7"}
    assert chat["tools"][0]["function"]["parameters"] == ADD["input_schema"]
