"""What real clients send and the gateway now takes: ``n`` choices (each its own exact sample),
Claude Code's Messages shapes (a system message inside ``messages``, text blocks, the billing
header, deferred tools and ``tool_reference`` results), ``count_tokens``, the Anthropic model
list, and Codex's WebSocket attempt on ``/responses``."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
import websockets.exceptions
import websockets.sync.client

from rollway.gateway import Gateway
from rollway.gateway.http.messages_request import MessagesRequest
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import ChatGeneration, SamplingParams
from tests.conftest import Served


def open_rollout(served: Served, **body: Any) -> tuple[str, str, dict[str, str]]:
    rollout_id = f"acc-{uuid.uuid4().hex[:8]}"
    url = f"{served.url}/v1/rollouts/{rollout_id}/register"
    reg = httpx.post(url, json=body, headers=served.admin_headers).json()
    return rollout_id, reg["base_url"], {"Authorization": f"Bearer {reg['api_key']}"}


def trajectory(served: Served, rollout_id: str) -> dict[str, Any]:
    url = f"{served.url}/v1/rollouts/{rollout_id}/trajectory?whole_prompts=true&samples=true"
    return httpx.get(url, headers=served.admin_headers).json()


def test_n_choices_are_each_an_exact_sample_and_the_first_goes_on(sim_served: Served) -> None:
    rollout_id, base_url, key = open_rollout(sim_served, max_tokens=6, seed=3)
    messages = [{"role": "user", "content": "Name a colour."}]
    body = {"messages": messages, "n": 3, "return_token_ids": True}
    answer = httpx.post(f"{base_url}/chat/completions", json=body, headers=key).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    record = trajectory(sim_served, rollout_id)
    turns = {t["index"]: t for t in record["turns"]}
    by_choice = [turns[c["turn_index"]] for c in answer["rollway"]["choices"]]
    assert len(record["turns"]) == 3 and record["segment_count"] == 3
    assert len({t["request_id"] for t in by_choice}) == 3
    for choice, turn in zip(answer["choices"], by_choice, strict=True):
        assert turn["completion_ids"] == choice["token_ids"]
        assert turn["prompt_ids"] == by_choice[0]["prompt_ids"]  # one prompt, sampled n times
    assert by_choice[0]["index"] == 2  # recorded last: the conversation goes on from it
    usage = answer["usage"]
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in answer["choices"])
    # The next request extends the first choice's segment, exactly.
    follow = [*messages, answer["choices"][0]["message"], {"role": "user", "content": "Another."}]
    httpx.post(f"{base_url}/chat/completions", json={"messages": follow}, headers=key)
    record = trajectory(sim_served, rollout_id)
    last = record["turns"][-1]
    assert last["segment"] == by_choice[0]["segment"] and record["segment_count"] == 3
    first_seq = by_choice[0]["prompt_ids"] + by_choice[0]["completion_ids"]
    assert last["prompt_ids"][: len(first_seq)] == first_seq
    assert len(record["samples"]) == 3  # one per segment: the first choice's and 2 branches
    sampled = sum(sum(sample["loss_mask"]) for sample in record["samples"])
    assert sampled == sum(len(t["completion_ids"]) for t in record["turns"])


CLAUDE_CODE = {
    "max_tokens": 16,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cch=1;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief."},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>cwd: /w</system-reminder>"},
                {"type": "text", "text": "List the files."},
            ],
        },
        {"role": "system", "content": "The user is in a hurry."},
    ],
    "tools": [
        {"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object"}},
        {
            "name": "Grep",
            "description": "Search files.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            "defer_loading": True,
        },
    ],
    "output_config": {"effort": "high"},
    "context_management": {"edits": []},
}


def test_claude_codes_request_renders_as_documented() -> None:
    chat = MessagesRequest.model_validate(CLAUDE_CODE).to_chat()
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\nBe brief."},
        {"role": "user", "content": "<system-reminder>cwd: /w</system-reminder>\nList the files."},
        {"role": "system", "content": "The user is in a hurry."},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["Bash"]  # Grep is deferred


def test_a_tool_reference_shows_the_deferred_tool_and_keeps_one_segment(
    sim_served: Served,
) -> None:
    rollout_id, base_url, key = open_rollout(sim_served)
    headers = key | {"anthropic-version": "2023-06-01"}
    body = json.loads(json.dumps(CLAUDE_CODE))
    first = httpx.post(f"{base_url}/v1/messages", json=body, headers=headers)
    assert first.status_code == 200, first.text
    answer = first.json()["content"]
    call = {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"q": "grep"}}
    reference = {"type": "tool_reference", "tool_name": "Grep"}
    body["messages"] += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Find the tool."},
        {"role": "assistant", "content": [call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [reference]}],
        },
    ]
    chat = MessagesRequest.model_validate(body).to_chat()
    assert json.loads(chat["messages"][-1]["content"])["name"] == "Grep"
    record = trajectory(sim_served, rollout_id)
    assert record["request_fields"][0]["fields"]["billing_header"][0].startswith("x-anthropic")
    assert record["request_fields"][0]["fields"]["output_config"] == {"effort": "high"}
    assert "x-anthropic-billing-header" not in json.dumps(record["messages"])


def test_count_tokens_is_the_prompt_the_turn_gets(sim_served: Served) -> None:
    rollout_id, base_url, key = open_rollout(sim_served)
    counted = httpx.post(f"{base_url}/v1/messages/count_tokens", json=CLAUDE_CODE, headers=key)
    assert counted.status_code == 200, counted.text
    httpx.post(f"{base_url}/v1/messages", json=CLAUDE_CODE, headers=key)
    (turn,) = trajectory(sim_served, rollout_id)["turns"]
    assert counted.json() == {"input_tokens": turn["prompt_len"]}


def test_the_model_list_has_anthropics_shape_too(sim_served: Served) -> None:
    _, base_url, key = open_rollout(sim_served)
    listed = httpx.get(f"{base_url}/v1/models", headers=key).json()
    (model,) = listed["data"]
    assert model["type"] == "model" and model["display_name"] == model["id"]
    assert listed["has_more"] is False and listed["first_id"] == model["id"]


def test_codexs_websocket_attempt_is_answered_426(sim_served: Served) -> None:
    """codex-rs falls back to HTTPS at once on a 426 to its handshake (any other status is
    retried first)."""
    _, base_url, key = open_rollout(sim_served)
    url = base_url.replace("http://", "ws://") + "/responses"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(url, additional_headers=key, open_timeout=10)
    assert refused.value.response.status_code == 426


class CountingChat:
    """A chat-level engine (a hosted API) that numbers its answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
        request_id: str,
    ) -> ChatGeneration:
        self.calls += 1
        return ChatGeneration(
            {"role": "assistant", "content": f"answer {self.calls}"}, "stop", 5, 2
        )

    async def abort(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_n_choices_behind_a_chat_level_engine_are_n_calls_the_first_goes_on(
    renderer: ChatRenderer,
) -> None:
    gateway = Gateway(CountingChat(), renderer, model_name="hosted")
    gateway.register("hosted-1", {})
    asked = {"messages": [{"role": "user", "content": "Hi."}], "n": 3}
    choices = await gateway.chat_choices("hosted-1", asked)
    # The first choice is answered last, so that the conversation goes on from it.
    assert [c.content for c in choices] == ["answer 3", "answer 1", "answer 2"]
    recorded = await gateway.trajectory("hosted-1")
    assert len(recorded.turns) == 3 and recorded.messages[-1]["content"] == "answer 3"
    assert [choice.turn_index for choice in choices] == [2, 0, 1]
