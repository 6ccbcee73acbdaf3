"""Top logprobs and entropy through the HTTP gateway: asked per request by an OpenAI client
(answered in OpenAI's shape and recorded on the turn) or fixed for the whole rollout at
registration (recorded whether the agent asks or not), aligned in the samples."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Closing, Served
from tests.gateway.test_http_openai_sdk import QUESTION, fetch_trajectory, register


def test_the_sdk_gets_top_logprobs_and_the_turn_records_them(
    served: Served, closing: Closing
) -> None:
    reg = register(served, temperature=0.7, seed=2, max_tokens=12)
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
    reply = client.chat.completions.create(
        model="m", messages=QUESTION, logprobs=True, top_logprobs=3
    )
    tokens = reply.choices[0].logprobs.content
    turn = fetch_trajectory(served, reg["rollout_id"])["turns"][0]
    steps = turn["distribution"]
    assert len(tokens) == len(turn["completion_ids"]) == len(steps["top_ids"])
    assert turn["sampling"]["top_logprobs"] == 3 and steps["entropy"] is None
    for token, top_ids, top_values in zip(
        tokens, steps["top_ids"], steps["top_logprobs"], strict=True
    ):
        assert [entry.logprob for entry in token.top_logprobs] == top_values
        assert len(top_ids) == 3 and top_values == sorted(top_values, reverse=True)
        assert token.logprob <= top_values[0] + 1e-6  # nothing sampled beats the most likely
        texts = [entry.token for entry in token.top_logprobs]
        if token.token in texts:  # the sampled token, where it is among them, agrees
            assert token.logprob == pytest.approx(top_values[texts.index(token.token)], abs=1e-6)


def test_registered_top_logprobs_and_entropy_are_recorded_on_every_turn(
    served: Served, closing: Closing
) -> None:
    reg = register(served, temperature=0.7, seed=3, max_tokens=8, top_logprobs=2,
                   record_entropy=True)  # fmt: skip
    client = closing(openai.OpenAI(base_url=reg["base_url"], api_key=reg["api_key"]))
    first = client.chat.completions.create(model="m", messages=QUESTION)
    assert first.choices[0].logprobs is None  # not asked by the caller: not answered
    messages: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And 3 + 4?"},
    ]
    client.chat.completions.create(model="m", messages=messages)
    trajectory = fetch_trajectory(served, reg["rollout_id"], samples=True)
    steps = [turn["distribution"] for turn in trajectory["turns"]]
    for turn, step in zip(trajectory["turns"], steps, strict=True):
        assert len(step["top_ids"]) == len(step["entropy"]) == len(turn["completion_ids"])
        assert all(value >= 0.0 for value in step["entropy"])
    (sample,) = trajectory["samples"]
    assert len(sample["top_ids"]) == len(sample["entropy"]) == len(sample["response_ids"])
    for mask, top_ids, entropy in zip(
        sample["loss_mask"], sample["top_ids"], sample["entropy"], strict=True
    ):
        assert (len(top_ids) == 2) if mask else (top_ids == [] and entropy == 0.0)
    sampled = [e for e, m in zip(sample["entropy"], sample["loss_mask"], strict=True) if m]
    assert sampled == [e for step in steps for e in step["entropy"]]


@pytest.mark.parametrize("bad", [21, -1, "3"])
def test_top_logprobs_out_of_range_is_a_422_naming_it(served: Served, bad: object) -> None:
    reg = register(served, max_tokens=4)
    response = httpx.post(
        f"{reg['base_url']}/chat/completions",
        json={"messages": QUESTION, "logprobs": True, "top_logprobs": bad},
        headers={"Authorization": f"Bearer {reg['api_key']}"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "top_logprobs"
