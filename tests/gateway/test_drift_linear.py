"""The drift figure takes linear time, off the event loop, even on a degenerate trajectory.

A policy collapsing into repetition is ordinary in RL training; a quadratic diff of its ids in
the request handler froze every rollout on the gateway (16k repeated tokens: ~110 s)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.trajectory_build import compare_ids
from rollway.web.background_server import BackgroundServer
from tests.conftest import Served, sim_gateway
from tests.gateway.health_probe import while_probing_health

REPEATS = 16_000


def collapsed_gateway(renderer: ChatRenderer, token_id: int) -> Gateway:
    """A sim engine whose every completion is one token repeated, then end-of-turn."""
    return sim_gateway(renderer, output_len=REPEATS, token_range=(token_id, token_id + 1))


@pytest.fixture
def served_collapse(renderer: ChatRenderer, token_id: int) -> Iterator[Served]:
    gateway = collapsed_gateway(renderer, token_id)
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        yield Served(url, admin_key, gateway)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("token_id", "text"),
    [(421, " ha"), (81, "a")],  # " ha" re-tokenizes as itself; "a" repeated merges into "aaaa"
    ids=["rerenders-equal", "rerenders-differently"],
)
def test_a_collapsed_rollout_of_16k_repeated_tokens_is_fetched_promptly(
    served_collapse: Served, renderer: ChatRenderer, token_id: int, text: str
) -> None:
    admin = httpx.Client(
        base_url=served_collapse.url, headers=served_collapse.admin_headers, timeout=120
    )
    with admin:
        key = admin.post("/v1/rollouts/rep/register", json={}).json()["api_key"]
        body = {"messages": [{"role": "user", "content": "Say ha."}]}
        chat = admin.post(
            "/v1/rollouts/rep/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        )
        assert chat.json()["usage"]["completion_tokens"] == REPEATS

        probed = while_probing_health(
            served_collapse.url, lambda: admin.get("/v1/rollouts/rep/trajectory", timeout=30.0)
        )
    assert probed.response.status_code == 200
    assert probed.elapsed_s < 2.0
    assert max(probed.health_s, default=0.0) < 0.25
    trajectory = probed.response.json()
    (turn,) = trajectory["turns"]
    drift = trajectory["drift"]
    recorded = turn["prompt_len"] + len(turn["completion_ids"]) + 1  # + closing "\n"
    assert drift["recorded_tokens"] == recorded
    middle = renderer.encode(text * (REPEATS - 1))  # the completion, re-tokenized
    if middle == [token_id] * (REPEATS - 1):
        assert drift["first_mismatch"] is None and drift["differing_tokens"] == 0
    else:  # what lies between the common prefix (prompt) and suffix (end of turn) differs
        starts, ends = middle[0] == token_id, middle[-1] == token_id
        assert drift["first_mismatch"] == turn["prompt_len"] + starts
        window = (REPEATS - 1) + len(middle) - 2 * (starts + ends)
        assert drift["differing_tokens"] == window


def test_drift_is_the_window_between_common_prefix_and_suffix() -> None:
    assert compare_ids([1, 2, 3], [1, 2, 3]).differing_tokens == 0
    one_change = compare_ids([1, 2, 3, 4, 5], [1, 2, 9, 9, 9, 4, 5])
    assert one_change.first_mismatch == 2 and one_change.differing_tokens == 1 + 3
    longer = compare_ids([1, 2, 3], [1, 2, 3, 4])
    assert longer.first_mismatch == 3 and longer.differing_tokens == 1
    # Prefix and suffix never overlap: [7] vs [7, 7] differ by one token, not -1.
    assert compare_ids([7], [7, 7]).differing_tokens == 1
    two_changes = compare_ids([1, 2, 3, 4, 5], [1, 9, 3, 9, 5])
    assert two_changes.first_mismatch == 1 and two_changes.differing_tokens == 3 + 3
