"""The shared routes through `rollway gateway --workers 2 --sessions open` (real subprocesses):
the front sends each call to the worker of the rollout its key or session names, so rollouts
held by both workers are each recorded apart, and a call naming none is refused."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.cli.test_gateway_workers import ADMIN_KEY, on_worker, start_front

SESSION_KEY = "sk-shared-workers"


@pytest.fixture
def front() -> Iterator[str]:
    proc, url = start_front("--sessions", "open", ROLLWAY_SESSION_KEY=SESSION_KEY)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def turns(url: str, rollout_id: str) -> int:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    answer = httpx.get(f"{url}/v1/rollouts/{rollout_id}/trajectory", headers=admin, timeout=30)
    assert answer.status_code == 200, answer.text
    return len(answer.json()["turns"])


@pytest.mark.timeout(180)
def test_the_front_routes_shared_calls_to_the_worker_holding_their_rollout(front: str) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    keys = {}
    for worker in (0, 1):
        rollout_id = on_worker(worker, "shared-")
        answer = httpx.post(
            f"{front}/v1/rollouts/{rollout_id}/register", json={}, headers=admin, timeout=30
        )
        assert answer.status_code == 200, answer.text
        keys[rollout_id] = answer.json()["api_key"]
    for key in keys.values():
        with openai.OpenAI(base_url=f"{front}/v1", api_key=key, timeout=30) as client:
            for _ in range(2):
                client.chat.completions.create(**body)
    for worker in (0, 1):
        session = on_worker(worker, "session-")
        headers = {"Authorization": f"Bearer {SESSION_KEY}", "X-Session-ID": session}
        answer = httpx.post(f"{front}/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        assert turns(front, session) == 1
    assert [turns(front, rollout_id) for rollout_id in keys] == [2, 2]
    refused = httpx.post(f"{front}/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 401 and "shared route" in refused.text
