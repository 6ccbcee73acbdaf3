"""Over HTTP the gateway checks only the messages a request adds to the rollout's previous
request (``gateway/request_messages.py``): the rest is taken as it was checked then. What that
must never change: a malformed message is named at its place, an edited earlier message is
seen, and the recorded prompt is the one the request's own messages render to."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollway.gateway import create_app, request_messages
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.trajectory import Trajectory
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, sim_gateway


class Rollout:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.id = f"reuse-{uuid.uuid4().hex[:8]}"
        key = client.post(f"/v1/rollouts/{self.id}/register", json={}).json()["api_key"]
        self.headers = {"Authorization": f"Bearer {key}"}

    def chat(self, messages: list[dict[str, Any]], **body: Any) -> httpx.Response:
        url = f"/v1/rollouts/{self.id}/chat/completions"
        return self.client.post(url, headers=self.headers, json={"messages": messages, **body})

    def reply(self, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
        answer = self.chat(messages, **body)
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["message"]

    def trajectory(self) -> dict[str, Any]:
        return self.client.get(f"/v1/rollouts/{self.id}/trajectory").json()


@pytest.fixture
def admin(renderer: ChatRenderer) -> Iterator[httpx.Client]:
    admin_key = f"ak-{secrets.token_hex(8)}"
    app = create_app(sim_gateway(renderer, output_len=8), admin_key=admin_key)
    with BackgroundServer(app) as url:
        headers = {"Authorization": f"Bearer {admin_key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            yield client


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages each validation of a request's messages took."""
    lengths: list[int] = []
    adapter = request_messages._MESSAGES

    class Counting:
        def validate_python(self, messages: list[Any]) -> Any:
            lengths.append(len(messages))
            return adapter.validate_python(messages)

    monkeypatch.setattr(request_messages, "_MESSAGES", Counting())
    return lengths


def conversation(rollout: Rollout, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for step in range(turns):
        messages = [*messages, rollout.reply(messages), {"role": "user", "content": f"{step}"}]
    return messages


def test_each_turn_checks_only_the_messages_it_adds(
    admin: httpx.Client, checked: list[int]
) -> None:
    rollout = Rollout(admin)
    messages = conversation(rollout, 6)
    assert len(messages) == 13
    # The first request's one message, then each turn's echoed reply and new user message.
    assert checked == [1] + [2] * 5
    trajectory = rollout.trajectory()
    assert trajectory["segment_count"] == 1 and len(trajectory["turns"]) == 6


def test_a_malformed_added_message_is_named_at_its_place(admin: httpx.Client) -> None:
    rollout = Rollout(admin)
    messages = conversation(rollout, 2)
    bad = [*messages, {"role": "wizard", "content": "x"}]
    answer = rollout.chat(bad)
    assert answer.status_code == 422
    assert answer.json()["error"]["param"] == f"messages.{len(messages)}.role"
    # The rollout goes on from where it was.
    rollout.reply([*messages, {"role": "user", "content": "fine"}])
    assert rollout.trajectory()["segment_count"] == 1


def test_an_edited_earlier_message_is_rendered_as_edited(
    admin: httpx.Client, renderer: ChatRenderer
) -> None:
    rollout = Rollout(admin)
    messages = conversation(rollout, 2)
    edited = [{"role": "user", "content": "Edited start."}, *messages[1:]]
    rollout.reply(edited)
    trajectory = Trajectory.model_validate(rollout.trajectory())
    assert trajectory.segment_count == 2
    last_prompt = renderer.decode(trajectory.prompt_ids(len(trajectory.turns) - 1))
    assert "Edited start." in last_prompt and "Start." not in last_prompt.replace("Edited ", "")


def test_arguments_equal_as_python_values_but_written_differently_are_seen(
    admin: httpx.Client,
) -> None:
    """1, 1.0 and true are equal dict values in Python but render differently: a request that
    changes one must not be taken for the previous one."""
    rollout = Rollout(admin)
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    messages = [
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]
    reply = rollout.reply(messages, tools=[ADD_TOOL])
    changed = {**call, "function": {"name": "add", "arguments": {"a": 1.0}}}
    again = [messages[0], {**messages[1], "tool_calls": [changed]}, messages[2], reply]
    rollout.reply([*again, {"role": "user", "content": "More."}], tools=[ADD_TOOL])
    assert rollout.trajectory()["segment_count"] == 2


def test_anthropic_messages_are_checked_only_past_the_previous_request(
    admin: httpx.Client, checked: list[int]
) -> None:
    rollout = Rollout(admin)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for step in range(4):
        answer = rollout.client.post(
            f"/v1/rollouts/{rollout.id}/messages",
            headers=rollout.headers,
            json={"max_tokens": 8, "system": "Be brief.", "messages": messages},
        )
        assert answer.status_code == 200, answer.text
        reply = {"role": "assistant", "content": answer.json()["content"]}
        messages = [*messages, reply, {"role": "user", "content": f"{step}"}]
    # The system prompt and first message, then each turn's echoed answer and new message.
    assert checked == [2] + [2] * 3
    trajectory = rollout.trajectory()
    assert trajectory["segment_count"] == 1 and len(trajectory["turns"]) == 4
