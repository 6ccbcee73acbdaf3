"""`rollway gateway --rollout-ttl` as a real subprocess: abandoned rollouts expire."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.cli.test_gateway_command import free_port


def wait_until_serving(proc: subprocess.Popen[bytes], client: httpx.Client) -> None:
    """Until uvicorn has bound the port; fails at once if the command exited."""
    while True:
        assert proc.poll() is None, "the gateway command exited"
        try:
            client.get("/health")
            return
        except httpx.ConnectError:
            time.sleep(0.1)


@pytest.mark.timeout(120)
def test_rollout_ttl_option_expires_an_abandoned_rollout() -> None:
    port, admin_key = free_port(), "ak-ttl-test"
    env = {**os.environ, "ROLLWAY_ADMIN_KEY": admin_key}
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", "sim", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--rollout-ttl", "0.5"], env=env, stdout=subprocess.DEVNULL)
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
            wait_until_serving(proc, client)
            assert client.post("/v1/rollouts/left/register", json={}).status_code == 200
            deadline = time.monotonic() + 10.0
            while "rollway_rollouts_expired_total 1.0" not in client.get("/metrics").text:
                assert time.monotonic() < deadline, "the abandoned rollout never expired"
                time.sleep(0.1)
            assert client.get("/v1/rollouts/left/trajectory").status_code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)
