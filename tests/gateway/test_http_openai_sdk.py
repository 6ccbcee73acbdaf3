"""The official openai SDK (sync, async, streaming, tools) against the HTTP gateway."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ADD_TOOL, FEW_SHOT, Closing, Served


def register(served: Served, **body: Any) -> dict[str, Any]:
    rollout_id = f"sdk-{uuid.uuid4().hex[:8]}"
    response = httpx.post(
        f"{served.url}/v1/rollouts/{rollout_id}/register", json=body, headers=served.admin_headers
    )
    assert response.status_code == 200, response.text
    return response.json()


def fetch_trajectory(
    served: Served, rollout_id: str, *, samples: bool = False, whole_prompts: bool = False
) -> dict[str, Any]:
    """The trajectory as the route gives it, with the extras for tools where asked."""
    response = httpx.get(
        f"{served.url}/v1/rollouts/{rollout_id}/trajectory",
        params={"samples": samples, "whole_prompts": whole_prompts},
        headers=served.admin_headers,
    )
    assert response.status_code == 200, response.text
    return response.json()


QUESTION = [*FEW_SHOT, {"role": "user", "content": "What is 17 + 25?"}]


def test_register_answers_a_base_url_the_sdk_takes(served: Served, closing: Closing) -> None:
    reg = register(served, temperature=0.7, seed=1)
    assert reg["base_url"] == f"{served.url}/v1/rollouts/{reg['rollout_id']}"
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
    assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct"]


def test_sync_client_holds_a_two_turn_tool_conversation(served: Served, closing: Closing) -> None:
    reg = register(served, temperature=0.7, seed=1, max_tokens=48)
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
    messages: list[Any] = list(QUESTION)
    first = client.chat.completions.create(model="m", messages=messages, tools=[ADD_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "add"
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=[ADD_TOOL])
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    trajectory = fetch_trajectory(served, reg["rollout_id"], samples=True, whole_prompts=True)
    assert trajectory["segment_count"] == 1 and len(trajectory["turns"]) == 2
    turn0, turn1 = trajectory["turns"]
    assert (
        turn0["prompt_ids"] + turn0["completion_ids"]
        == turn1["prompt_ids"][: len(turn0["prompt_ids"]) + len(turn0["completion_ids"])]
    )
    assert len(turn1["completion_ids"]) == second.usage.completion_tokens
    (sample,) = trajectory["samples"]
    assert (
        sum(sample["loss_mask"]) == first.usage.completion_tokens + second.usage.completion_tokens
    )


async def test_async_client_and_logprobs(served: Served) -> None:
    reg = register(served, temperature=0.0, max_tokens=16)
    client = openai.AsyncOpenAI(base_url=reg["base_url"], api_key=reg["api_key"])
    reply = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hello."}], logprobs=True
    )
    await client.close()
    tokens = reply.choices[0].logprobs.content
    turn = fetch_trajectory(served, reg["rollout_id"])["turns"][0]
    assert [t.logprob for t in tokens] == turn["logprobs"]
    assert len(tokens) == reply.usage.completion_tokens


def test_streaming_gives_the_same_answer_as_the_record(served: Served, closing: Closing) -> None:
    reg = register(served, temperature=0.7, seed=1, max_tokens=48)
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
    stream = client.chat.completions.create(
        model="m",
        messages=QUESTION,
        tools=[ADD_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    content, names, finish, usage = "", [], None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            names += [c.function.name for c in choice.delta.tool_calls or []]
            finish = choice.finish_reason or finish
    turn = fetch_trajectory(served, reg["rollout_id"])["turns"][0]
    assert names == [c["function"]["name"] for c in turn["tool_calls"]]
    assert content == (turn["content"] or "")
    assert finish == ("tool_calls" if names else turn["finish_reason"])
    assert usage is not None and usage.completion_tokens == len(turn["completion_ids"])


def test_return_token_ids_adds_what_was_sampled_in_fields_the_sdk_ignores(
    served: Served,
    closing: Closing,
) -> None:
    reg = register(served, temperature=0.7, seed=3, max_tokens=12)
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
    messages: list[Any] = [{"role": "user", "content": "Say hello."}]
    plain = client.chat.completions.create(model="m", messages=messages)
    asked = client.chat.completions.create(
        model="m", messages=messages, extra_body={"return_token_ids": True}
    )
    stream = client.chat.completions.create(
        model="m", messages=messages, stream=True, extra_body={"return_token_ids": True}
    )
    last = [chunk for chunk in stream if chunk.choices and chunk.choices[0].finish_reason][-1]
    turns = fetch_trajectory(served, reg["rollout_id"])["turns"]
    assert "rollway" not in (plain.model_extra or {})
    assert "token_ids" not in (plain.choices[0].model_extra or {})
    for answer, turn in ((asked, turns[1]), (last, turns[2])):
        assert answer.choices[0].model_extra["token_ids"] == turn["completion_ids"]
        assert answer.model_extra["rollway"] == {
            "turn_index": turn["index"],
            "logprobs": turn["logprobs"],
        }
    assert len(turns[1]["completion_ids"]) == asked.usage.completion_tokens > 0


def test_streaming_plain_text(served: Served, closing: Closing) -> None:
    reg = register(served, temperature=0.0, max_tokens=24)
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hello."}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text and text == fetch_trajectory(served, reg["rollout_id"])["turns"][0]["content"]


def test_the_sdk_raises_its_own_errors_for_gateway_errors(served: Served, closing: Closing) -> None:
    reg = register(served)
    wrong = closing(openai.OpenAI(base_url=reg["base_url"], api_key="not-the-key", max_retries=0))
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0))
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], extra_body={"mystery": 1}
        )
