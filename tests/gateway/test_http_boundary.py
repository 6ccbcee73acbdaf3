"""The gateway's boundary: malformed content is a 4xx that names the field (never a 500), the
key is checked before the rollout is looked up, and rollout ids follow one safe rule."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollway.agents.server.callback_inbox import CallbackInbox
from rollway.errors import InvalidFieldsError
from rollway.gateway import create_app
from rollway.web.background_server import BackgroundServer
from tests.conftest import Served

USER = {"role": "user", "content": "hi"}


@pytest.fixture
def admin(sim_served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim_served.url, headers=sim_served.admin_headers) as client:
        yield client
    assert httpx.get(f"{sim_served.url}/health").json()["status"] == "ok"


def register(admin: httpx.Client) -> tuple[str, dict[str, str]]:
    rollout_id = f"edge-{uuid.uuid4().hex[:8]}"
    reg = admin.post(f"/v1/rollouts/{rollout_id}/register", json={}).json()
    return rollout_id, {"Authorization": f"Bearer {reg['api_key']}"}


def assert_error(response: httpx.Response, status: int, words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"], error
    return error


MALFORMED = [
    ("responses", {"input": [{}]}, "input.0"),
    ("responses", {"input": [{"type": "function_call", "name": "f"}]}, "call_id"),
    ("responses", {"input": [{"type": "function_call_output", "output": "1"}]}, "call_id"),
    ("responses", {"input": [{"role": "user", "content": 5}]}, "input.0"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "text"),
    ("responses", {"input": [{"role": "user", "content": [5]}]}, "content"),
    ("responses", {"input": "hi", "text": {"format": 5}}, "text.format"),
    ("responses", {"input": "hi", "tools": [{"type": "function"}]}, "tools.0.name"),
    ("messages", {"max_tokens": 8, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "name": "add", "input": {}}]}]}, "id"),
    ("messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "content": "7"}]}]}, "tool_use_id"),
    ("messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": 5}]}]}, "text"),
    ("messages", {"max_tokens": 8, "messages": [USER], "system": [{"type": "text"}]}, "system"),
    ("messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"text": 1}]}]}]}, "content"),
    ("chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": 0}]}]}, "text"),
    ("chat/completions", {"messages": [{"role": "user", "content": [5]}]}, "content"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "field"), MALFORMED)
def test_malformed_content_is_422_naming_the_field(
    admin: httpx.Client, route: str, body: dict[str, Any], field: str
) -> None:
    rollout_id, key = register(admin)
    response = admin.post(f"/v1/rollouts/{rollout_id}/{route}", json=body, headers=key)
    error = assert_error(response, 422, field)
    assert error["param"] and field.split(".")[0] in error["param"]


ROLLOUT_ROUTES = [
    ("POST", "chat/completions"),
    ("POST", "messages"),
    ("POST", "v1/messages"),
    ("POST", "responses"),
    ("GET", "models"),
]
ADMIN_ROUTES = [("POST", "register"), ("GET", "trajectory"), ("POST", "cancel"),
                ("POST", "unregister")]  # fmt: skip
NON_ASCII = "ключ-é".encode()


@pytest.mark.parametrize(("method", "route"), ROLLOUT_ROUTES + ADMIN_ROUTES)
@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_non_ascii_keys_are_401_on_every_authenticated_route(
    admin: httpx.Client, sim_served: Served, method: str, route: str, header: str
) -> None:
    rollout_id, _ = register(admin)
    value = (b"Bearer " if header == "authorization" else b"") + NON_ASCII
    url = f"{sim_served.url}/v1/rollouts/{rollout_id}/{route}"
    response = httpx.request(method, url, headers={header: value}, json={})
    assert_error(response, 401, "key")


def test_metrics_with_a_non_ascii_key_is_401(sim_served: Served) -> None:
    response = httpx.get(
        f"{sim_served.url}/metrics", headers={"authorization": b"Bearer " + NON_ASCII}
    )
    assert_error(response, 401, "admin key")


@pytest.mark.parametrize(("method", "route"), ROLLOUT_ROUTES)
def test_a_wrong_key_is_401_whether_or_not_the_rollout_exists(
    admin: httpx.Client, sim_served: Served, method: str, route: str
) -> None:
    known, _ = register(admin)
    unknown = f"ghost-{uuid.uuid4().hex[:8]}"
    answers = []
    for rollout_id in (known, unknown):
        url = f"{sim_served.url}/v1/rollouts/{rollout_id}/{route}"
        for headers in ({}, {"Authorization": "Bearer rk-guess"}, sim_served.admin_headers):
            response = httpx.request(method, url, headers=headers, json={})
            error = assert_error(response, 401, rollout_id)
            answers.append((response.status_code, error["message"].replace(rollout_id, "ID")))
    assert len(set(answers)) == 1, answers


@pytest.mark.parametrize(
    "path_id", ["h%231", "a%3Fb", "a%25b", "a%00b", "a%0Ab", "%2E%2E", "%2E", ".hidden", "a%20b",
                "caf%C3%A9", "x" * 257],
)  # fmt: skip
def test_unsafe_rollout_ids_are_refused_at_register(admin: httpx.Client, path_id: str) -> None:
    response = admin.post(f"/v1/rollouts/{path_id}/register", json={})
    error = assert_error(response, 422, "not a valid id")
    assert error["param"] == "rollout_id"


def test_a_safe_id_gets_a_base_url_that_reaches_it(admin: httpx.Client, sim_served: Served) -> None:
    rollout_id = f"Exp_1.task-{uuid.uuid4().hex[:6]}.0"
    reg = admin.post(f"/v1/rollouts/{rollout_id}/register", json={}).json()
    assert reg["base_url"] == f"{sim_served.url}/v1/rollouts/{rollout_id}"
    key = {"Authorization": f"Bearer {reg['api_key']}"}
    answer = httpx.post(f"{reg['base_url']}/chat/completions", json={"messages": [USER]},
                        headers=key)  # fmt: skip
    assert answer.status_code == 200
    assert admin.get(f"/v1/rollouts/{rollout_id}/trajectory").json()["turns"]


def test_in_process_register_applies_the_same_rule(sim_served: Served) -> None:
    with pytest.raises(InvalidFieldsError, match="not a valid id"):
        sim_served.gateway.register("h#1", {})


def test_the_client_callback_route_on_the_gateway_answers_401_to_a_non_ascii_key(
    sim_served: Served,
) -> None:
    inbox = CallbackInbox()
    app = create_app(sim_served.gateway, admin_key="ak", close_engine=False,
                     extra_routes=[inbox.route()])  # fmt: skip
    with BackgroundServer(app) as url:
        headers = {"authorization": b"Bearer " + NON_ASCII}
        response = httpx.post(f"{url}/v1/rollout/completed", headers=headers, json={})
        assert_error(response, 401, "callback key")


def test_answers_carry_a_date_and_no_server_name(admin: httpx.Client) -> None:
    rollout_id, key = register(admin)
    body = {"messages": [USER]}
    answer = admin.post(f"/v1/rollouts/{rollout_id}/chat/completions", json=body, headers=key)
    assert answer.status_code == 200
    assert "server" not in answer.headers  # uvicorn's is left out: nothing said about the stack
    assert answer.headers["date"]  # RFC 9110: an origin server with a clock sends one
