"""Prompts past the model's context are refused with a 400 naming the limit, before the engine,
without tokenizing megabytes, and without blocking other requests while they are measured."""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator

import httpx
import pytest

from rollway.engines.embedded import EmbeddedEngine
from rollway.gateway import build_gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.token_bound import TokenBound
from rollway.web.background_server import BackgroundServer
from tests.conftest import Served
from tests.gateway.health_probe import while_probing_health


@pytest.fixture(scope="module")
def served_big(engine: EmbeddedEngine) -> Iterator[Served]:
    """The gateway as `rollway gateway` builds it (the model's context known), taking the
    default body size (8 MiB)."""
    gateway = build_gateway(engine)
    admin_key = f"ak-{secrets.token_hex(8)}"
    app = create_app(gateway, admin_key=admin_key, close_engine=False)
    with BackgroundServer(app) as url:
        yield Served(url, admin_key, gateway)


def chat_once(served: Served, content: str, **register: object) -> httpx.Response:
    rollout_id = f"long-{secrets.token_hex(4)}"
    with httpx.Client(base_url=served.url, headers=served.admin_headers, timeout=60.0) as admin:
        reg = admin.post(f"/v1/rollouts/{rollout_id}/register", json=register).json()
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4}
        headers = {"Authorization": f"Bearer {reg['api_key']}"}
        return admin.post(f"/v1/rollouts/{rollout_id}/chat/completions", json=body, headers=headers)


def words(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    vocabulary = ["river", "stone", "quiet", "lantern", "orbit", "moss", "ember", "tide", "a"]
    text = " ".join(rng.choice(vocabulary) for _ in range(n_chars // 4))
    return text[:n_chars]


def assert_refused_naming_the_context(response: httpx.Response, engine: EmbeddedEngine) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert str(engine.context_length) in error["message"] and error["param"] == "messages"


@pytest.mark.timeout(60)
def test_a_megabytes_prompt_is_refused_at_once_and_never_reaches_the_engine(
    served_big: Served, engine: EmbeddedEngine
) -> None:
    batches_before = engine.batches_run
    probed = while_probing_health(served_big.url, lambda: chat_once(served_big, "x " * 3_900_000))
    assert_refused_naming_the_context(probed.response, engine)
    assert "at least" in probed.response.json()["error"]["message"]
    assert probed.elapsed_s < 5.0  # tokenizing it took 15 s
    assert max(probed.health_s, default=0.0) < 0.25
    assert engine.batches_run == batches_before


@pytest.mark.timeout(60)
def test_a_prompt_measured_by_tokenizing_it_never_blocks_health(
    served_big: Served, engine: EmbeddedEngine, renderer: ChatRenderer
) -> None:
    # Short enough that its length alone cannot rule it out, long enough to take a while.
    content = words(600_000)
    assert renderer.bound.at_least(content) <= engine.context_length
    probed = while_probing_health(served_big.url, lambda: chat_once(served_big, content))
    assert_refused_naming_the_context(probed.response, engine)
    assert len(probed.health_s) >= 3, "the refusal came too fast to probe anything"
    assert max(probed.health_s) < 0.25


def test_a_prompt_that_fits_is_answered(served_big: Served) -> None:
    response = chat_once(served_big, words(400))
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] > 0


def test_the_rollouts_own_max_seq_len_still_truncates_rather_than_refuses(
    served_big: Served,
) -> None:
    response = chat_once(served_big, "x " * 3_900_000, max_seq_len=64)
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_the_length_bound_never_exceeds_the_true_token_count(renderer: ChatRenderer) -> None:
    bound = TokenBound(renderer.tokenizer)
    assert bound.in_bytes and bound.unit_limit is not None
    rng = random.Random(7)
    pieces = ["hello", " world", "\n", "    ", "€", "日本語", "#" * 80, "=" * 65, "<|im_start|>"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 200)))
        assert bound.at_least(text) <= len(renderer.encode(text))
    longest = max(renderer.tokenizer.get_vocab(), key=len)  # a run the bound must allow for
    assert bound.at_least(renderer.decode(renderer.tokenizer.convert_tokens_to_ids([longest]))) <= 1
