"""Who asks for top logprobs and entropy: the registration (the trainer) and each request (an
OpenAI client's own ``top_logprobs``). A turn records what either asked; an OpenAI answer holds
exactly the ``top_logprobs`` its request asked, in OpenAI's shape, whatever was registered. An
in-process caller's fields are checked as strictly as a wire body's: ``True`` is not 1."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from rollway.errors import InvalidFieldsError
from rollway.gateway import build_gateway, create_app
from rollway.simulators.vllm_server import create_vllm_sim_app
from rollway.web.background_server import BackgroundServer

ADMIN = {"Authorization": "Bearer ak-top-logprobs"}


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    """A gateway over a simulated vLLM server, which gives top logprobs."""
    with BackgroundServer(create_vllm_sim_app()) as engine_url:
        gateway = build_gateway("vllm://" + engine_url.split("://", 1)[1])
        with BackgroundServer(create_app(gateway, admin_key="ak-top-logprobs")) as url:
            yield url


def _turn(url: str, rollout_id: str, registered: dict[str, Any], asked: dict[str, Any]) -> tuple:
    """One chat call of a fresh rollout: the answer's choice and the recorded turn."""
    with httpx.Client(base_url=url, timeout=30) as http:
        register = http.post(f"/v1/rollouts/{rollout_id}/register", json=registered, headers=ADMIN)
        key = register.raise_for_status().json()["api_key"]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **asked}
        answer = http.post(
            f"/v1/rollouts/{rollout_id}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        )
        assert answer.status_code == 200, answer.text
        trajectory = http.get(f"/v1/rollouts/{rollout_id}/trajectory", headers=ADMIN).json()
    return _choice(answer, bool(asked.get("stream"))), trajectory["turns"][-1]


def _choice(answer: httpx.Response, streamed: bool) -> dict[str, Any]:
    if not streamed:
        return answer.json()["choices"][0]
    events = [
        orjson.loads(line[6:])
        for line in answer.text.splitlines()
        if line.startswith("data: {") and '"choices":[{' in line
    ]
    return next(e["choices"][0] for e in events if e["choices"][0]["finish_reason"])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("registered", "asked"), [(5, 2), (5, 10), (5, None), (0, 10)])
def test_an_openai_answer_holds_exactly_the_top_logprobs_its_request_asked(
    gateway_url: str, registered: int, asked: int | None, stream: bool
) -> None:
    ask: dict[str, Any] = {"logprobs": True, "stream": stream}
    if asked is not None:
        ask["top_logprobs"] = asked
    rollout_id = f"ask-{registered}-{asked}-{stream}"
    choice, turn = _turn(gateway_url, rollout_id, {"top_logprobs": registered}, ask)
    content = choice["logprobs"]["content"]
    assert len(content) == len(turn["completion_ids"]) == 4
    # The turn records what either side asked; the answer, what the request asked.
    recorded = max(registered, asked or 0)
    assert turn["sampling"]["top_logprobs"] == recorded
    assert [len(ids) for ids in turn["distribution"]["top_ids"]] == [recorded] * 4
    for entry, values in zip(content, turn["distribution"]["top_logprobs"], strict=True):
        answered = [top["logprob"] for top in entry["top_logprobs"]]
        assert answered == values[: asked or 0]  # most likely first, as recorded


def test_a_requests_record_entropy_is_recorded_where_registration_set_it_false(
    gateway_url: str,
) -> None:
    _, turn = _turn(gateway_url, "entropy-asked", {"record_entropy": False},
                    {"record_entropy": True})  # fmt: skip
    assert turn["sampling"]["record_entropy"] is True


@pytest.mark.parametrize(
    "fields", [{"top_logprobs": True}, {"top_logprobs": "3"}, {"record_entropy": "no"}]
)
def test_an_in_process_caller_gets_no_loose_top_logprobs_or_record_entropy(
    fields: dict[str, Any],
) -> None:
    gateway = build_gateway("sim")
    (name,) = fields
    with pytest.raises(InvalidFieldsError, match=name) as raised:
        gateway.register("loose-register", fields)
    assert raised.value.param == name
    gateway.register("loose-chat", {})
    request = {"messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(InvalidFieldsError, match=name):
        asyncio.run(gateway.chat("loose-chat", request))
    assert asyncio.run(gateway.trajectory("loose-chat")).turns == []
