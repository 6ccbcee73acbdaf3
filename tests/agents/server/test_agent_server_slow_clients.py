"""`rollway serve-agent` faces the network with a request deadline: connections that send
nothing or half a request are closed, and normal requests are still served."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.agents.server.fixtures import AUTH, KEY
from tests.gateway.slow_clients import IdleClients

AGENT = Path(__file__).with_name("agents.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_agent_closes_idle_connections_and_keeps_serving() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "rollway", "serve-agent", f"{AGENT}:TaskDrivenAgent",
           "--port", str(port), "--request-timeout", "1", "--max-connections", "512"]  # fmt: skip
    env = {**os.environ, "ROLLWAY_AGENT_KEY": KEY}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL) as proc:
        try:
            url = f"http://127.0.0.1:{port}"
            transport = httpx.HTTPTransport(retries=100)  # until uvicorn listens
            with httpx.Client(base_url=url, transport=transport, timeout=60) as http:
                assert http.get("/health").status_code == 200
                with IdleClients(url, count=150) as idle:
                    assert http.get("/v1/health", headers=AUTH).json()["agent"] == "task-driven"
                    idle.wait_closed(timeout=30)
                    assert len(idle.closed_after) == idle.count
                    assert min(idle.closed_after.values()) >= 0.9
                assert http.get("/v1/health", headers=AUTH).status_code == 200
        finally:
            proc.terminate()
