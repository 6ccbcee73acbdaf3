"""A SIGTERM (how Kubernetes, Slurm and `ray job stop` end a service) stops `rollway gateway`
and `rollway serve-agent` as Ctrl-C does: uvicorn stops taking connections, answers what is in
flight, runs the app's shutdown, and the process then ends by the signal it got."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.agents.server.fixtures import wait_until
from tests.cli.test_gateway_command import free_port
from tests.cli.test_gateway_rollout_ttl import wait_until_serving
from tests.client.conftest import spawn_agent_server

ADMIN_KEY = "ak-sigterm-test"
#: Ten tokens, one every 0.2 s: the answer is still streaming when the signal comes.
SLOW_STREAM = "sim://?latency_s=0&per_token_s=0.2&output_len=10"


@pytest.mark.timeout(120)
def test_a_sigterm_lets_the_gateway_finish_the_answer_in_flight_then_exit() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", SLOW_STREAM,
           "--port", str(port)]  # fmt: skip
    env = {**os.environ, "ROLLWAY_ADMIN_KEY": ADMIN_KEY}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            wait_until_serving(proc, client)
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            key = client.post("/v1/rollouts/r/register", headers=admin, json={}).json()["api_key"]
            body = {"model": "sim", "stream": True, "max_tokens": 10,
                    "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            auth = {"Authorization": f"Bearer {key}"}
            with client.stream(
                "POST", "/v1/rollouts/r/chat/completions", headers=auth, json=body
            ) as answer:
                lines = (line for line in answer.iter_lines() if line.startswith("data: "))
                before = [next(lines), next(lines)]  # the answer has started: it is in flight
                proc.send_signal(signal.SIGTERM)
                after = list(lines)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    assert after[-1] == "data: [DONE]" and len(after) > 2, (before, after)
    chunks = [orjson.loads(line.removeprefix("data: ")) for line in before + after[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # the whole answer, not cut
    assert b"Traceback" not in err


@pytest.mark.timeout(120)
def test_a_sigterm_makes_the_agent_server_report_its_running_rollouts_cancelled(
    tmp_path: Path,
) -> None:
    key = "ag-sigterm-test"
    log = tmp_path / "agent-server.log"
    store = tmp_path / "reports"
    with spawn_agent_server(log, key, "--store", str(store)) as (url, process):
        auth = {"Authorization": f"Bearer {key}"}
        gateway = "http://127.0.0.1:9/v1/rollouts/r0"  # never called: the agent sleeps first
        init = {"rollout_id": "r0", "exp_id": "exp", "api_key": "rk-test",
                "base_url": gateway, "task": {"sleep": 600}}  # fmt: skip
        with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
            assert http.post("/v1/rollout/init", json=init).status_code < 300
            wait_until(lambda: http.get("/v1/rollout/r0").json()["status"] == "running")
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == -signal.SIGTERM, log.read_text()
    reports = [orjson.loads(p.read_bytes()) for p in store.rglob("*.json")]
    assert [r["status"] for r in reports] == ["cancelled"], (reports, log.read_text())
    assert "Traceback" not in log.read_text()
