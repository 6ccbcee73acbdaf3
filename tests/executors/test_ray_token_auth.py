"""A Ray cluster started with token authentication, joined by `rollway run` without the token
(``RAY_AUTH_MODE`` unset): it fails at once, saying the cluster wants a token and where
docs/ray.md says how to give it, not after 20 s of refusals with a hint about the address."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.exceptions import AuthenticationError

from rollway.cli.failures import explain
from rollway.executors.ray_executor import ray_start_error
from tests.agents.server.fixtures import wait_until
from tests.cli.test_gateway_command import free_port
from tests.cli.test_run_failures import AGENT_SOURCE

RAY = Path(sys.executable).with_name("ray")
#: Ray 2.60's words when its GCS refuses a driver without the token.
REFUSED = "RPC error: InvalidAuthToken: Authentication token is missing or incorrect"


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[str]:
    """A one-node cluster in a process group of its own (killed whole at the end: `ray stop`
    would stop every cluster on the machine), under a short temp dir (Ray's socket paths)."""
    port = free_port()
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "HOME": str(temp)}  # fmt: skip
    cmd = [str(RAY), "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
           "--include-dashboard=false", "--disable-usage-stats",
           f"--temp-dir={temp}/r"]  # fmt: skip
    log = temp / "head.log"
    with log.open("wb") as out:
        head = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: _answers(head, port, log), timeout=90)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
        shutil.rmtree(temp, ignore_errors=True)


def _answers(head: subprocess.Popen[bytes], port: int, log: Path) -> bool:
    assert head.poll() is None, log.read_text()
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(240)
def test_a_run_without_the_clusters_token_fails_at_once_with_the_token_hint(
    token_cluster: str, tmp_path: Path
) -> None:
    (tmp_path / "echo.py").write_text(AGENT_SOURCE)
    (tmp_path / "tasks.jsonl").write_text('{"question": "q"}\n')
    # No token anywhere: not in the environment, not in ~/.ray/auth_token.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {
        "HOME": str(tmp_path)
    }
    ran = subprocess.run(
        [sys.executable, "-m", "rollway", "run", "echo.py:Echo", "--tasks", "tasks.jsonl",
         "--engine", "sim", "--executor", "ray", "--ray-address", token_cluster, "--out", "runs"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    error, hint = ran.stderr.splitlines()[-2:]
    assert error.startswith(f"error: cannot start Ray ({token_cluster})") and REFUSED in error
    assert "RAY_AUTH_MODE=token" in hint and "docs/ray.md#token-authentication" in hint
    assert "--ray-address" not in hint
    # One try at the cluster, not ray.init's twenty (one a second, each logged).
    assert ran.stderr.count("InvalidAuthToken") <= 2, ran.stderr


def test_rays_refusal_inside_its_connection_error_gets_the_token_hint() -> None:
    """What ``ray.init`` raises against a token cluster when it is not tried first (``ray://``,
    ``auto``): a ``ConnectionError`` naming the address, Ray's ``AuthenticationError`` as the
    last line of its cause."""
    refusal = AuthenticationError(REFUSED)
    try:
        try:
            raise RuntimeError(f"Failed to connect to GCS. Last connection error: Traceback ...\n"
                               f"ray.exceptions.AuthenticationError: {refusal}")  # fmt: skip
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from inner
    except ConnectionError as exc:
        failure = explain(ray_start_error(exc, "10.0.0.1:6379"))
    assert REFUSED in failure.message and "Ensure that" not in failure.message
    assert "docs/ray.md#token-authentication" in failure.hint
    assert "docs/ray.md#token-authentication" in explain(ray_start_error(refusal, None)).hint
