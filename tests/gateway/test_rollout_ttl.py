"""A shared gateway drops rollouts that a dead client left idle (counted on /metrics), and
never one with a generation in flight."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.web.background_server import BackgroundServer

TTL_S = 0.5
GENERATION_S = 2.0  # four times the TTL


@pytest.fixture
def admin(renderer: ChatRenderer) -> Iterator[httpx.Client]:
    engine = SimEngine(SimConfig(latency_s=GENERATION_S))
    gateway = Gateway(engine, renderer, model_name="sim", rollout_ttl_s=TTL_S)
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        headers = {"Authorization": f"Bearer {admin_key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30.0) as client:
            yield client


def expired_count(admin: httpx.Client) -> float:
    found = re.search(r"^rollway_rollouts_expired_total (\S+)$", admin.get("/metrics").text, re.M)
    assert found, "the expiry counter is not exported"
    return float(found.group(1))


def wait_for_expired(admin: httpx.Client, count: float, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while expired_count(admin) < count:
        assert time.monotonic() < deadline, f"fewer than {count} rollouts expired"
        time.sleep(TTL_S / 10)


@pytest.mark.timeout(30)
def test_an_idle_rollout_expires_but_one_generating_does_not(admin: httpx.Client) -> None:
    keys = {}
    for rollout_id in ("idle", "busy"):
        keys[rollout_id] = admin.post(f"/v1/rollouts/{rollout_id}/register", json={}).json()
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    busy_headers = {"Authorization": f"Bearer {keys['busy']['api_key']}"}
    with ThreadPoolExecutor(1) as pool:
        chat = pool.submit(
            admin.post, "/v1/rollouts/busy/chat/completions", json=body, headers=busy_headers
        )
        wait_for_expired(admin, 1, within_s=GENERATION_S * 0.8)
        assert not chat.done()  # the idle one went while the busy one was generating
        answer = chat.result()
    assert answer.status_code == 200, answer.text
    assert admin.get("/v1/rollouts/idle/trajectory").status_code == 404
    busy = admin.get("/v1/rollouts/busy/trajectory")
    assert busy.status_code == 200 and len(busy.json()["turns"]) == 1
    assert expired_count(admin) == 1
    assert "rollway_rollouts_active 1.0" in admin.get("/metrics").text
    # Once its client stops calling, the busy one expires too, and its key stops working
    # (401, as for any key the gateway does not know: ids cannot be probed).
    wait_for_expired(admin, 2, within_s=GENERATION_S)
    again = admin.post("/v1/rollouts/busy/chat/completions", json=body, headers=busy_headers)
    assert again.status_code == 401
    assert admin.get("/v1/rollouts/busy/trajectory").status_code == 404
