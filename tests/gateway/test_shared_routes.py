"""One base URL for many rollouts: the gateway's shared routes (``/v1/chat/completions``,
``/v1/messages``, ``/v1/responses``, ``/v1/models`` at the root) find each call's rollout by
its key or its ``X-Session-ID``, through the real openai and anthropic SDKs; a call that names
no rollout is refused, never merged; a rollout whose calls hold many conversations is
flagged."""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from rollway.gateway import build_gateway, create_app
from rollway.gateway.http.rollout_lookup import Sessions
from rollway.web.background_server import BackgroundServer
from tests.conftest import Closing, Served

SESSION_KEY = "sk-shared-routes-test"


@pytest.fixture(scope="module", params=[Sessions.OFF, Sessions.KNOWN, Sessions.OPEN])
def shared(request: pytest.FixtureRequest) -> Iterator[tuple[Served, Sessions]]:
    gateway = build_gateway("sim")
    admin_key = f"ak-{secrets.token_hex(8)}"
    app = create_app(gateway, admin_key=admin_key, sessions=request.param, session_key=SESSION_KEY)
    with BackgroundServer(app) as url:
        yield Served(url, admin_key, gateway), request.param


def register(served: Served, rollout_id: str | None = None, **body: Any) -> dict[str, Any]:
    rollout_id = rollout_id or f"r-{uuid.uuid4().hex[:8]}"
    answer = httpx.post(
        f"{served.url}/v1/rollouts/{rollout_id}/register", json=body, headers=served.admin_headers
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def turns_of(served: Served, rollout_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{served.url}/v1/rollouts/{rollout_id}/trajectory", headers=served.admin_headers
    )
    assert answer.status_code == 200, answer.text
    turns: list[dict[str, Any]] = answer.json()["turns"]
    return turns


def ask(client: openai.OpenAI, question: str) -> str:
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


def test_calls_on_one_base_url_land_in_the_rollout_their_key_names(
    shared: tuple[Served, Sessions], closing: Closing
) -> None:
    served, _ = shared
    first, second = register(served), register(served)
    for registration, questions in ((first, ["a", "b", "c"]), (second, ["d", "e"])):
        client = closing(
            openai.OpenAI(base_url=f"{served.url}/v1", api_key=registration["api_key"])
        )
        for question in questions:
            ask(client, question)
        assert [m.id for m in client.models.list()] == [served.gateway.model_name]
    assert len(turns_of(served, first["rollout_id"])) == 3
    assert len(turns_of(served, second["rollout_id"])) == 2


def test_the_anthropic_sdk_on_the_shared_url_reaches_its_rollout(
    shared: tuple[Served, Sessions], closing: Closing
) -> None:
    served, _ = shared
    registration = register(served)
    client = closing(anthropic.Anthropic(base_url=served.url, api_key=registration["api_key"]))
    message = client.messages.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.role == "assistant"
    assert len(turns_of(served, registration["rollout_id"])) == 1


@pytest.mark.parametrize("key", [None, "rk-not-a-rollout", "admin"])
def test_a_call_that_names_no_rollout_is_refused_and_recorded_nowhere(
    shared: tuple[Served, Sessions], key: str | None
) -> None:
    served, _ = shared
    bystander = register(served)
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    if key == "admin":
        headers = served.admin_headers
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/chat/completions", "/v1/responses"):
        answer = httpx.post(f"{served.url}{path}", json=body, headers=headers)
        assert answer.status_code == 401, answer.text
        assert "shared route" in answer.json()["error"]["message"]
    assert turns_of(served, bystander["rollout_id"]) == []


def test_session_ids_follow_the_operators_choice(shared: tuple[Served, Sessions]) -> None:
    served, sessions = shared
    known = register(served)["rollout_id"]
    fresh = f"s-{uuid.uuid4().hex[:8]}"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def call(session: str, key: str = SESSION_KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}", "X-Session-ID": session}
        return httpx.post(f"{served.url}/v1/chat/completions", json=body, headers=headers)

    if sessions is Sessions.OFF:
        answer = call(known)
        assert answer.status_code == 401 and "--sessions" in answer.json()["error"]["message"]
        assert turns_of(served, known) == []
        return
    assert call(known, key="sk-wrong").status_code == 401
    assert call(known).status_code == 200
    assert len(turns_of(served, known)) == 1
    if sessions is Sessions.KNOWN:
        answer = call(fresh)
        assert answer.status_code == 404 and "--sessions open" in answer.json()["error"]["message"]
        return
    assert call(fresh).status_code == 200 and call(fresh).status_code == 200
    assert len(turns_of(served, fresh)) == 2
    assert call("../bad id").status_code == 422


def test_a_rollout_holding_many_conversations_is_counted_and_warned_once(
    sim_served: Served, closing: Closing, caplog: pytest.LogCaptureFixture
) -> None:
    served = sim_served
    one = register(served)
    merged = register(served, max_conversations=2)
    client = closing(openai.OpenAI(base_url=f"{served.url}/v1", api_key=one["api_key"]))
    for _ in range(3):  # one conversation, asked again: not several
        ask(client, "the same task")
    client = closing(openai.OpenAI(base_url=f"{served.url}/v1", api_key=merged["api_key"]))
    with caplog.at_level(logging.WARNING, logger="rollway.gateway.conversations"):
        for question in ["task 1", "task 2", "task 3", "task 4", "task 5"]:
            ask(client, question)
    warned = [r for r in caplog.records if r.name == "rollway.gateway.conversations"]
    assert len(warned) == 1 and merged["rollout_id"] in warned[0].getMessage()
    trajectories = {
        r["rollout_id"]: httpx.get(
            f"{served.url}/v1/rollouts/{r['rollout_id']}/trajectory", headers=served.admin_headers
        ).json()
        for r in (one, merged)
    }
    assert trajectories[one["rollout_id"]]["conversations"] == 1
    assert trajectories[merged["rollout_id"]]["conversations"] == 5
