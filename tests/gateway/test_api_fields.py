"""Every field the real APIs' SDKs define is accepted or refused by name: the official
``anthropic`` and ``openai`` packages' request TypedDicts are walked, each field sent on its
own with a value a real client sends; the answer is a 200 (the field applied, or recorded on
the turn) or a 4xx whose ``param`` names the field, never pydantic's "extra inputs"."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from anthropic.types import message_count_tokens_params, message_create_params
from anthropic.types.beta import message_create_params as beta_message_create_params
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from rollway.gateway.http.messages_request import MessagesRequest
from rollway.gateway.http.responses_api import ResponsesRequest
from rollway.gateway.request_schema import ChatCompletionRequest
from tests.conftest import Served

ADD = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "cache_control": {"type": "ephemeral"},
}
FUNCTION = {"type": "function", "name": "add", "parameters": {"type": "object"}}
CHAT_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}

#: A value a real client sends for each field of Anthropic's MessageCreateParams (beta too).
ANTHROPIC = {
    "model": "m",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
    "betas": ["context-management-2025-06-27"],
    "billing_policy": {"type": "standard"},
    "cache_control": {"type": "ephemeral"},
    "compaction": {"type": "auto"},
    "container": "container_1",
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "diagnostics": {"previous_message_id": "msg_1"},
    "fallback_credit_token": "token",
    "fallbacks": [{"model": "other"}],
    "inference_geo": "us",
    "mcp_servers": [{"type": "url", "url": "https://example.com/mcp", "name": "x"}],
    "metadata": {"user_id": "u1"},
    "output_config": {"effort": "high"},
    "service_tier": "auto",
    "speed": "fast",
    "stop_sequences": ["END"],
    "stream": False,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "thread": {"type": "create"},
    "tool_choice": {"type": "auto"},
    "tools": [ADD],
    "user_profile_id": "profile_1",
    "workspace_id": "wrkspc_1",
}
#: Each field of OpenAI's ResponseCreateParams, and Codex's client_metadata.
RESPONSES = {
    "model": "m",
    "input": "What is 2 + 2?",
    "access_programs": ["program_1"],
    "background": True,
    "background_options": {},
    "client_metadata": {"session": "s1"},
    "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    "conversation": "conv_1",
    "image": {"size": "1024x1024"},
    "include": ["message.output_text.logprobs"],
    "instructions": "Be brief.",
    "max_output_tokens": 8,
    "max_tool_calls": 2,
    "metadata": {"a": "b"},
    "moderation": {"mode": "off"},
    "parallel_tool_calls": True,
    "previous_response_id": "resp_unknown",
    "prompt": {"id": "pmpt_1"},
    "prompt_cache_key": "key",
    "prompt_cache_options": {},
    "prompt_cache_retention": "24h",
    "reasoning": {"effort": "low", "summary": "auto"},
    "safety_identifier": "s",
    "service_tier": "auto",
    "store": False,
    "stream": False,
    "stream_options": {"include_obfuscation": False},
    "temperature": 0.5,
    "text": {"format": {"type": "text"}, "verbosity": "low"},
    "tool_choice": "auto",
    "tools": [{"type": "web_search"}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "truncation": "auto",
    "user": "u1",
}
#: Each field of OpenAI's chat CompletionCreateParams.
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [{"name": "add", "parameters": {"type": "object"}}],
    "logit_bias": {"1": 5},
    "logprobs": True,
    "max_completion_tokens": 8,
    "max_tokens": 8,
    "metadata": {"a": "b"},
    "modalities": ["text"],
    "moderation": {"mode": "off"},
    "n": 2,
    "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "4"},
    "presence_penalty": 0,
    "prompt_cache_key": "key",
    "prompt_cache_options": {},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "safety_identifier": "s",
    "seed": 1,
    "service_tier": "auto",
    "stop": ["END"],
    "store": False,
    "stream": False,
    "stream_options": {"include_usage": True, "include_obfuscation": False},
    "temperature": 0.5,
    "tool_choice": "auto",
    "tools": [CHAT_TOOL],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "u1",
    "verbosity": "low",
    "web_search_options": {},
}


def sdk_fields(*typed_dicts: type) -> set[str]:
    return {name for typed in typed_dicts for name in typed.__annotations__} | {"stream"}


ANTHROPIC_FIELDS = sdk_fields(
    message_create_params.MessageCreateParamsBase,
    beta_message_create_params.MessageCreateParamsBase,
)
COUNT_FIELDS = sdk_fields(message_count_tokens_params.MessageCountTokensParams) - {"stream"}
RESPONSES_FIELDS = sdk_fields(response_create_params.ResponseCreateParamsBase)
CHAT_FIELDS = sdk_fields(completion_create_params.CompletionCreateParamsBase)
BASE = {
    "messages": ("model", "max_tokens", "messages"),
    "responses": ("model", "input"),
    "chat/completions": ("model", "messages"),
}


def test_every_sdk_field_has_a_value_here() -> None:
    """A field a new SDK adds fails here first: give it a value (and a disposition)."""
    assert ANTHROPIC.keys() >= ANTHROPIC_FIELDS
    assert RESPONSES.keys() >= RESPONSES_FIELDS
    assert CHAT.keys() >= CHAT_FIELDS


def open_rollout(served: Served) -> tuple[str, dict[str, str]]:
    rollout_id = f"fields-{uuid.uuid4().hex[:8]}"
    url = f"{served.url}/v1/rollouts/{rollout_id}/register"
    reg = httpx.post(url, json={"max_tokens": 8}, headers=served.admin_headers).json()
    return reg["base_url"], {"Authorization": f"Bearer {reg['api_key']}"}


def recorded(served: Served, base_url: str) -> dict[str, Any]:
    rollout_id = base_url.rstrip("/").rsplit("/", 1)[1]
    url = f"{served.url}/v1/rollouts/{rollout_id}/trajectory"
    return httpx.get(url, headers=served.admin_headers).json()


def assert_taken_or_named(response: httpx.Response, field: str) -> None:
    assert "Extra inputs" not in response.text, response.text
    if response.status_code == 200:
        return
    assert 400 <= response.status_code < 500, response.text
    param = response.json()["error"]["param"]
    assert param.startswith(field), (field, response.text)


def send_each(
    served: Served,
    path: str,
    values: dict[str, Any],
    fields: set[str],
    recorded_names: tuple[str, ...],
) -> list[str]:
    """Each field on its own over the base request; the fields that were answered 200."""
    base = {name: values[name] for name in BASE[path]}
    taken = []
    for field in sorted(fields - set(BASE[path])):
        base_url, key = open_rollout(served)
        body = base | {field: values[field]}
        response = httpx.post(f"{base_url}/{path}", json=body, headers=key, timeout=30)
        assert_taken_or_named(response, field)
        if response.status_code != 200:
            continue
        taken.append(field)
        if field in recorded_names:
            record = recorded(served, base_url)
            assert record["request_fields"][0]["fields"][field] == values[field], field
    return taken


def test_every_anthropic_messages_field_is_taken_or_refused_by_name(sim_served: Served) -> None:
    taken = send_each(sim_served, "messages", ANTHROPIC, ANTHROPIC_FIELDS, MessagesRequest.RECORDED)
    assert {"output_config", "context_management", "metadata", "cache_control"} <= set(taken)
    assert {"mcp_servers", "thread"}.isdisjoint(taken)


def test_every_count_tokens_field_is_taken(sim_served: Served) -> None:
    base_url, key = open_rollout(sim_served)
    body = {name: ANTHROPIC[name] for name in COUNT_FIELDS}
    response = httpx.post(f"{base_url}/v1/messages/count_tokens", json=body, headers=key)
    assert response.status_code == 200, response.text
    assert response.json()["input_tokens"] > 0


def test_every_responses_field_is_taken_or_refused_by_name(sim_served: Served) -> None:
    taken = send_each(
        sim_served,
        "responses",
        RESPONSES,
        RESPONSES_FIELDS | {"client_metadata"},
        ResponsesRequest.RECORDED,
    )
    assert {"client_metadata", "reasoning", "prompt_cache_key", "store"} <= set(taken)
    assert {"tools", "conversation", "prompt", "background"}.isdisjoint(taken)


def test_every_chat_completions_field_is_taken_or_refused_by_name(sim_served: Served) -> None:
    taken = send_each(
        sim_served, "chat/completions", CHAT, CHAT_FIELDS, ChatCompletionRequest.RECORDED
    )
    assert {"n", "modalities", "prediction", "reasoning_effort", "metadata"} <= set(taken)
    refused = {"audio", "functions", "logit_bias", "response_format", "web_search_options"}
    assert refused.isdisjoint(taken)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
                        ],
                    }
                ]
            },
            "messages[0].content[1].type",
        ),
        (
            "chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {}},
                },
            },
            "response_format",
        ),
        (
            "messages",
            {
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": ""},
                            }
                        ],
                    }
                ],
            },
            "messages[0].content[0].type",
        ),
        (
            "messages",
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0]",
        ),
        (
            "responses",
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}},
            "text.format",
        ),
    ],
)
def test_what_cannot_be_done_is_a_400_naming_the_field(
    sim_served: Served, path: str, body: dict[str, Any], param: str
) -> None:
    base_url, key = open_rollout(sim_served)
    response = httpx.post(f"{base_url}/{path}", json=body, headers=key)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param)
