"""`rollway gateway` as a real subprocess: prints its address and admin key, then serves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollway.gateway.render.renderers import RENDERERS
from tests.cli.test_run_failures import rollway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gateway_process() -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ROLLWAY_ADMIN_KEY"}
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", "sim", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    with proc:  # closes the pipe and reaps the process
        yield proc, port
        proc.terminate()


def test_gateway_command_prints_address_and_generated_admin_key(
    gateway_process: tuple[subprocess.Popen[str], int],
) -> None:
    proc, port = gateway_process
    assert proc.stdout is not None
    address = proc.stdout.readline()
    key_line = proc.stdout.readline()
    assert f"http://127.0.0.1:{port}" in address
    admin_key = key_line.split("admin key:")[1].strip()
    # The port accepts connections once uvicorn has bound it; retry connects until then.
    transport = httpx.HTTPTransport(retries=50)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=transport) as client:
        wrong = client.post("/v1/rollouts/r/register", headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401
        reg = client.post(
            "/v1/rollouts/r/register", headers={"Authorization": f"Bearer {admin_key}"}, json={}
        )
        assert reg.status_code == 200 and reg.json()["base_url"].endswith("/v1/rollouts/r")


def test_unknown_engine_is_a_one_line_error_not_a_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollway", "gateway", "--engine", "warp"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "unknown engine spec 'warp'" in result.stderr
    assert "Traceback" not in result.stderr


def test_gateway_help_names_every_renderer_and_the_scripted_engine(tmp_path: Path) -> None:
    """The renderer names come from the registry, the one list of them (a family added there
    is in the help without more)."""
    ran = rollway("gateway", "--help", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    text = " ".join(ran.stdout.split())  # as wrapped to the terminal, unwrapped
    assert f"({', '.join(RENDERERS)})" in text
    assert "scripted://FILE" in text


def test_workers_with_the_embedded_engine_are_warned_about_at_start(tmp_path: Path) -> None:
    """Warned before the model loads: the test stops there (a missing model folder)."""
    missing = str(tmp_path / "no-model")
    ran = rollway("gateway", "--workers", "2", "--model", missing, cwd=tmp_path)
    assert "warning: --workers 2 with the embedded engine" in ran.stderr, ran.stderr
    assert "remote engines (vllm://, sglang://)" in ran.stderr
    one = rollway("gateway", "--model", missing, cwd=tmp_path)
    assert "warning" not in one.stderr and one.returncode == 1
