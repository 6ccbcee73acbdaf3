"""A server that a test stops and starts again on the same loopback port, as a restarted
component comes back where its clients expect it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

import httpx

from rollway.web.background_server import BackgroundServer

#: A ``rollway`` process loads its tokenizer first: seconds, more on a loaded machine.
READY_WITHIN_S = 120.0


class RestartableServer:
    """Serves ``make_app()`` on a loopback port (the OS picks it at the first start, later
    starts reuse it). Each ``start`` serves a fresh app: it knows nothing of the old one's
    state, as after a real restart."""

    def __init__(self) -> None:
        self.port = 0
        self._server: BackgroundServer | None = None
        self.url = self.start()

    def make_app(self) -> Any:
        raise NotImplementedError

    def start(self) -> str:
        self._server = BackgroundServer(self.make_app(), port=self.port)
        url = self._server.start()
        self.port = int(url.rsplit(":", 1)[1])
        return url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def restart(self) -> None:
        self.stop()
        self.start()


class RestartableProcess:
    """A ``rollway`` command serving on a fixed loopback port, as a real process (``{port}`` in
    ``args`` is the port): ``stop`` SIGKILLs it, as a crash, ``start`` runs it again on the
    same port and returns once ``ready_path`` answers 200."""

    def __init__(
        self, args: list[str], *, env: dict[str, str] | None = None, ready_path: str = "/health"
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.args, self.env, self.ready_path = args, env, ready_path
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> str:
        command = [a.format(port=self.port) for a in self.args]
        env = {**os.environ, **(self.env or {})}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "rollway", *command], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + READY_WITHIN_S
        what = f"rollway {' '.join(command)}"
        while not self._ready():
            if self._process.poll() is not None:
                raise AssertionError(f"{what} exited {self._process.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not ready in {READY_WITHIN_S} s")
            time.sleep(0.1)
        return self.url

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=30)
            self._process = None

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}{self.ready_path}", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False
