"""A server that a test stops and starts again on the same loopback port, as a restarted
component comes back where its clients expect it."""

from __future__ import annotations

from typing import Any

from rollway.web.background_server import BackgroundServer


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
