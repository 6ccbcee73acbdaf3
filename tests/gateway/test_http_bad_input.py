"""Bad input gets a clear OpenAI-shaped error with the right status; the server keeps serving."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollway.errors import InvalidFieldsError, RolloutClosedError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from tests.conftest import Served, sim_gateway


@pytest.fixture
def admin(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=served.admin_headers, timeout=120) as client:
        yield client
    # Whatever the test sent, the server still answers.
    assert httpx.get(f"{served.url}/health").json()["status"] == "ok"


def new_rollout(admin: httpx.Client, **body: Any) -> tuple[str, dict[str, str]]:
    rollout_id = f"bad-{uuid.uuid4().hex[:8]}"
    reg = admin.post(f"/v1/rollouts/{rollout_id}/register", json=body).json()
    return rollout_id, {"Authorization": f"Bearer {reg['api_key']}"}


def post_chat(admin: httpx.Client, rollout_id: str, headers: dict[str, str], **kw: Any):
    return admin.post(f"/v1/rollouts/{rollout_id}/chat/completions", headers=headers, **kw)


def assert_error(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["type"]


def test_malformed_json_is_400(admin: httpx.Client) -> None:
    rid, key = new_rollout(admin)
    json_type = {**key, "Content-Type": "application/json"}
    assert_error(post_chat(admin, rid, json_type, content=b"{not json"), 400, "not valid JSON")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "mystery": 1}, "mystery"),
    ],
)
def test_invalid_fields_are_422_and_name_the_field(
    admin: httpx.Client, body: dict[str, Any], field: str
) -> None:
    rid, key = new_rollout(admin)
    assert_error(post_chat(admin, rid, key, json=body), 422, field)


def test_unknown_rollout_is_401_like_a_wrong_key(admin: httpx.Client) -> None:
    response = post_chat(admin, "nobody", {}, json={"messages": []})
    assert_error(response, 401, "nobody")


def test_wrong_key_is_401_and_a_key_reaches_only_its_rollout(admin: httpx.Client) -> None:
    rid, _ = new_rollout(admin)
    _, other_key = new_rollout(admin)
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert_error(post_chat(admin, rid, {"Authorization": "Bearer nope"}, json=body), 401, rid)
    assert_error(post_chat(admin, rid, other_key, json=body), 401, rid)
    assert_error(post_chat(admin, rid, {}, json=body), 401, rid)


def test_admin_routes_need_the_admin_key(admin: httpx.Client, served: Served) -> None:
    rid, key = new_rollout(admin)
    for method, route in (("POST", "register"), ("GET", "trajectory"), ("POST", "cancel")):
        response = httpx.request(method, f"{served.url}/v1/rollouts/{rid}/{route}", headers=key)
        assert_error(response, 401, "admin key")
    assert_error(httpx.get(f"{served.url}/metrics", headers=key), 401, "admin key")


def test_oversized_body_is_413(admin: httpx.Client) -> None:
    rid, key = new_rollout(admin)
    huge = {"messages": [{"role": "user", "content": "x" * 100_000}]}
    assert_error(post_chat(admin, rid, key, json=huge), 413, "exceeds")


def test_unknown_route_and_wrong_method_get_openai_shaped_errors(admin: httpx.Client) -> None:
    assert_error(admin.get("/v1/nowhere"), 404, "Not Found")
    wrong_method = admin.get("/v1/rollouts/x/chat/completions")
    assert_error(wrong_method, 405, "Method Not Allowed")
    assert wrong_method.headers["allow"] == "POST"  # RFC 9110: a 405 names what is allowed


def test_registering_twice_is_409(admin: httpx.Client) -> None:
    rid, _ = new_rollout(admin)
    assert_error(admin.post(f"/v1/rollouts/{rid}/register", json={}), 409, "already")


def test_register_with_bad_limits_is_422(admin: httpx.Client) -> None:
    response = admin.post("/v1/rollouts/limits/register", json={"max_turns": 0})
    assert_error(response, 422, "max_turns")


@pytest.mark.parametrize(
    ("field", "value"),
    [("seed", True), ("max_tokens", True), ("temperature", "0.5"), ("max_turns", True),
     ("max_seq_len", 64.0), ("stop_token_ids", [True]), ("top_k", "5")],
)  # fmt: skip
def test_register_refuses_values_of_the_wrong_json_type_naming_the_field(
    admin: httpx.Client, field: str, value: Any
) -> None:
    response = admin.post(f"/v1/rollouts/loose-{field}/register", json={field: value})
    assert_error(response, 422, field)
    assert response.json()["error"]["param"].split(".")[0] == field  # stop_token_ids.0


def test_json_numbers_of_either_kind_are_accepted_where_a_float_is_due(
    admin: httpx.Client,
) -> None:
    rid, key = new_rollout(admin, temperature=1, top_p=1.0, seed=3, max_tokens=4)
    body = {"messages": [{"role": "user", "content": "x"}], "temperature": 0, "top_p": 0.5}
    assert post_chat(admin, rid, key, json=body).status_code == 200


@pytest.mark.parametrize(("field", "value"), [("stream", "true"), ("logprobs", 1), ("n", 1.0)])
def test_chat_refuses_values_of_the_wrong_json_type_naming_the_field(
    admin: httpx.Client, field: str, value: Any
) -> None:
    rid, key = new_rollout(admin)
    body = {"messages": [{"role": "user", "content": "x"}], field: value}
    assert_error(post_chat(admin, rid, key, json=body), 422, field)


def test_a_reuse_flag_that_is_not_a_boolean_is_422(admin: httpx.Client) -> None:
    rid, _ = new_rollout(admin)
    assert_error(admin.post(f"/v1/rollouts/{rid}/register?reuse=yes", json={}), 422, "reuse")
    assert admin.post(f"/v1/rollouts/{rid}/register?reuse=TRUE", json={}).status_code == 200


def test_cancelled_rollout_refuses_further_turns_with_409(admin: httpx.Client) -> None:
    rid, key = new_rollout(admin)
    assert admin.post(f"/v1/rollouts/{rid}/cancel").status_code == 200
    # A cancel with nothing in flight (the client's own at cleanup) cuts nothing short...
    assert admin.get(f"/v1/rollouts/{rid}/trajectory").json()["is_cancelled"] is False
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert_error(post_chat(admin, rid, key, json=body), 409, "cancelled")
    assert admin.get(f"/v1/rollouts/{rid}/trajectory").json()["is_cancelled"] is True


def test_unregistered_rollout_is_gone(admin: httpx.Client) -> None:
    rid, _ = new_rollout(admin)
    assert admin.post(f"/v1/rollouts/{rid}/unregister").status_code == 200
    assert_error(admin.get(f"/v1/rollouts/{rid}/trajectory"), 404, rid)


def test_max_turns_answers_length_without_the_engine(admin: httpx.Client) -> None:
    rid, key = new_rollout(admin, max_turns=1, max_tokens=4)
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    assert post_chat(admin, rid, key, json=body).status_code == 200
    past = post_chat(admin, rid, key, json=body).json()
    assert past["choices"][0]["finish_reason"] == "length"
    assert past["usage"]["completion_tokens"] == 0
    trajectory = admin.get(f"/v1/rollouts/{rid}/trajectory").json()
    assert len(trajectory["turns"]) == 1
    assert trajectory["is_truncated"] and trajectory["truncation_reason"] == "max_turns"


def test_max_seq_len_caps_generation_and_then_refuses(admin: httpx.Client) -> None:
    rid, key = new_rollout(admin, max_seq_len=40, temperature=1.0, seed=5)
    body = {"messages": [{"role": "user", "content": "Write a long poem about rivers."}]}
    first = post_chat(admin, rid, key, json=body).json()
    turn = admin.get(f"/v1/rollouts/{rid}/trajectory?whole_prompts=true").json()["turns"][0]
    assert len(turn["prompt_ids"]) + len(turn["completion_ids"]) <= 40
    if first["choices"][0]["finish_reason"] == "length":
        assert admin.get(f"/v1/rollouts/{rid}/trajectory").json()["is_truncated"]
    long_body = {"messages": [{"role": "user", "content": "word " * 60}]}
    past = post_chat(admin, rid, key, json=long_body).json()
    assert past["choices"][0]["finish_reason"] == "length"
    trajectory = admin.get(f"/v1/rollouts/{rid}/trajectory").json()
    assert trajectory["truncation_reason"] == "max_seq_len" and len(trajectory["turns"]) == 1


def test_metrics_count_turns(admin: httpx.Client) -> None:
    text = admin.get("/metrics").text
    assert "rollway_turns_total" in text and "rollway_rollouts_active" in text


async def test_cancel_aborts_the_in_flight_generation(renderer: ChatRenderer) -> None:
    gateway: Gateway = sim_gateway(renderer, latency_s=60.0)
    gateway.register("slow", {})
    chat = asyncio.create_task(
        gateway.chat("slow", {"messages": [{"role": "user", "content": "hi"}]})
    )
    await asyncio.sleep(0)  # let the task run up to its first wait
    assert gateway._rollouts["slow"].in_flight
    await gateway.cancel("slow")
    with pytest.raises(RolloutClosedError):
        await chat
    trajectory = await gateway.trajectory("slow")
    assert trajectory.is_cancelled and trajectory.turns[0].finish_reason == "abort"


#: One rule each for the sampling and limit fields, over HTTP and in process (the register body,
#: the chat body): (field, value, where). SmolLM2's vocabulary holds ids 0 to 49151.
REFUSED_EVERYWHERE = [
    ("stop", [""], "empty"),
    ("stop", "", "empty"),
    ("stop_token_ids", [-1], "0 to 2147483647"),
    ("stop_token_ids", [2**40], "0 to 2147483647"),
    ("stop_token_ids", [49152], "vocabulary"),
]


@pytest.mark.parametrize(("field", "value", "words"), REFUSED_EVERYWHERE)
def test_register_and_chat_refuse_each_bad_sampling_value_naming_the_field(
    admin: httpx.Client, renderer: ChatRenderer, field: str, value: Any, words: str
) -> None:
    registered = admin.post(f"/v1/rollouts/bad-{uuid.uuid4().hex}/register", json={field: value})
    assert_error(registered, 422, words)
    assert registered.json()["error"]["param"] == field
    rid, key = new_rollout(admin)
    body = {"messages": [{"role": "user", "content": "x"}], field: value}
    chat = post_chat(admin, rid, key, json=body)
    assert_error(chat, 422, words)
    assert chat.json()["error"]["param"] == field
    gateway = sim_gateway(renderer)  # in process: the same refusals
    with pytest.raises(InvalidFieldsError, match=words) as raised:
        gateway.register("in-process", {field: value})
    assert raised.value.param == field
    gateway.register("in-process-chat", {})
    with pytest.raises(InvalidFieldsError, match=words) as raised:
        asyncio.run(gateway.chat("in-process-chat", body))
    assert raised.value.param == field


def test_the_last_id_of_the_vocabulary_is_a_stop_id(admin: httpx.Client) -> None:
    rid, key = new_rollout(admin, stop_token_ids=[0, 49151], max_tokens=2)
    body = {"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [49151]}
    assert post_chat(admin, rid, key, json=body).status_code == 200


@pytest.mark.parametrize("max_seq_len", [2**63, 2**31])
def test_a_max_seq_len_past_int32_is_refused_over_http_and_in_process(
    admin: httpx.Client, renderer: ChatRenderer, max_seq_len: int
) -> None:
    response = admin.post("/v1/rollouts/long/register", json={"max_seq_len": max_seq_len})
    assert_error(response, 422, "max_seq_len")
    with pytest.raises(InvalidFieldsError, match="max_seq_len"):
        sim_gateway(renderer).register("long", {"max_seq_len": max_seq_len})
    edge = admin.post(f"/v1/rollouts/long-{max_seq_len}/register", json={"max_seq_len": 2**31 - 1})
    assert edge.is_success, edge.text


def test_chat_refuses_top_logprobs_without_logprobs_naming_it(
    admin: httpx.Client, renderer: ChatRenderer
) -> None:
    rid, key = new_rollout(admin, max_tokens=2)
    body = {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    response = post_chat(admin, rid, key, json=body)
    assert_error(response, 422, "logprobs: true")
    assert response.json()["error"]["param"] == "top_logprobs"
    gateway = sim_gateway(renderer)
    gateway.register("in-process", {})
    with pytest.raises(InvalidFieldsError, match="logprobs: true"):
        asyncio.run(gateway.chat("in-process", body))
    assert post_chat(admin, rid, key, json={**body, "logprobs": True}).status_code == 200


@pytest.mark.parametrize(
    ("send", "status", "words"),
    [({}, 422, "empty"), ({"content": b"  "}, 422, "empty"),
     ({"json": []}, 422, "JSON object"), ({"json": "x"}, 422, "JSON object"),
     ({"content": b"{}", "headers": {"Content-Type": "text/plain"}}, 415, "text/plain"),
     ({"data": {"temperature": "0.5"}}, 415, "x-www-form-urlencoded"),
     ({"files": {"f": b"{}"}}, 415, "multipart/form-data")],
)  # fmt: skip
def test_register_takes_only_a_json_object_sent_as_application_json(
    admin: httpx.Client, send: dict[str, Any], status: int, words: str
) -> None:
    if "content" in send and "headers" not in send:
        send = {**send, "headers": {"Content-Type": "application/json"}}
    response = admin.post(f"/v1/rollouts/body-{uuid.uuid4().hex}/register", **send)
    assert_error(response, status, words)
    assert response.json()["error"]["param"] == ("content-type" if status == 415 else "body")
    # A JSON type with parameters, or a +json type, is JSON.
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        rid = f"body-{uuid.uuid4().hex}"
        ok = admin.post(
            f"/v1/rollouts/{rid}/register", content=b"{}", headers={"Content-Type": kind}
        )
        assert ok.status_code == 200, ok.text
