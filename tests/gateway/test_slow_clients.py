"""Slow clients cannot starve the gateway: each request has a deadline to arrive (idle,
trickling and half-sent connections are closed), while answers may take as long as they need,
and `rollway gateway` takes the limits as options."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway, create_app
from rollway.web.background_server import BackgroundServer
from rollway.web.uvicorn_server import (
    SERVING_GC_THRESHOLD,
    ServerLimits,
    tune_collector_for_serving,
)
from tests.conftest import Served
from tests.gateway.slow_clients import IdleClients

TIMEOUT_S = 1.0


@pytest.fixture
def strict_gateway(sim_served: Served) -> Iterator[str]:
    """The sim gateway behind a one-second request deadline."""
    app = create_app(sim_served.gateway, admin_key=sim_served.admin_key, close_engine=False)
    with BackgroundServer(app, limits=ServerLimits(request_timeout_s=TIMEOUT_S)) as url:
        yield url


def test_idle_connections_are_closed_at_the_deadline_while_others_are_served(
    strict_gateway: str,
) -> None:
    with IdleClients(strict_gateway, count=300) as idle:
        assert httpx.get(f"{strict_gateway}/health", timeout=10).status_code == 200
        idle.wait_closed(timeout=30)
        assert len(idle.closed_after) == idle.count, "some idle connections were never closed"
        # Closed by the deadline, not before.
        assert min(idle.closed_after.values()) >= TIMEOUT_S * 0.9
    assert httpx.get(f"{strict_gateway}/health", timeout=10).status_code == 200


def test_a_client_trickling_its_headers_is_closed_at_the_deadline(strict_gateway: str) -> None:
    host, port = strict_gateway.removeprefix("http://").split(":")
    endless = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: 1\r\n" * 200
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        try:
            for byte in endless:  # one valid byte every 50 ms: the headers never end
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
                if time.monotonic() - started > 15:
                    break
            closed = sock.recv(1) == b""
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        except TimeoutError:  # still open, waiting for the rest
            closed = False
        took = time.monotonic() - started
    assert closed and TIMEOUT_S * 0.9 <= took < 15, took


def test_answers_slower_than_the_deadline_are_not_cut(sim_served: Served) -> None:
    slow = Gateway(SimEngine(SimConfig(latency_s=1.6)), sim_served.gateway.renderer,
                   model_name="sim")  # fmt: skip
    app = create_app(slow, admin_key="ak", close_engine=False)
    limits = ServerLimits(request_timeout_s=TIMEOUT_S, keep_alive_s=10)
    with BackgroundServer(app, limits=limits) as url, httpx.Client(timeout=30) as http:
        admin = {"x-api-key": "ak"}
        reg = http.post(f"{url}/v1/rollouts/slow/register", headers=admin, json={}).json()
        body = {"messages": [{"role": "user", "content": "take your time"}]}
        key = {"Authorization": f"Bearer {reg['api_key']}"}
        for _ in range(2):  # the second on the same kept-alive connection
            answer = http.post(f"{reg['base_url']}/chat/completions", json=body, headers=key)
            assert answer.status_code == 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_gateway_command_takes_the_limits() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", "sim", "--port", str(port),
           "--request-timeout", "1", "--max-connections", "64", "--keep-alive", "2"]  # fmt: skip
    env = {**os.environ, "ROLLWAY_ADMIN_KEY": "ak"}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL) as proc:
        try:
            url = f"http://127.0.0.1:{port}"
            transport = httpx.HTTPTransport(retries=100)  # until uvicorn listens
            with httpx.Client(transport=transport, timeout=60) as http:
                assert http.get(f"{url}/health").status_code == 200
            with IdleClients(url, count=30) as idle:
                idle.wait_closed(timeout=30)
                assert len(idle.closed_after) == idle.count
        finally:
            proc.terminate()


def test_a_serving_process_freezes_what_start_up_made_and_collects_young_objects_less_often():
    before = gc.get_threshold()
    made_at_start_up = [[i] for i in range(1000)]
    try:
        tune_collector_for_serving()
        assert gc.get_threshold() == SERVING_GC_THRESHOLD
        assert SERVING_GC_THRESHOLD[0] > before[0]
        # Everything alive now sits in the permanent generation, out of every collection.
        assert gc.get_freeze_count() >= len(made_at_start_up)
        assert not any(gc.is_tracked(x) and x in gc.get_objects(0) for x in made_at_start_up[:3])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
