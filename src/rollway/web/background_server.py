"""Run an ASGI app on a loopback port in a background thread (demo, tests, notebooks), or on
the current event loop; both under ``ServerLimits`` (request deadline, keep-alive, connection
cap)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp

from rollway.tempdirs import make_owned_tempdir
from rollway.web.uvicorn_server import ServerLimits, uvicorn_config


class BackgroundServer:
    """``with BackgroundServer(app) as url:`` serves ``app`` until the block ends."""

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ServerLimits | None = None,
    ) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        bound_host, bound_port = self._socket.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        config = uvicorn_config(
            app,
            limits or ServerLimits(),
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def start(self, timeout: float = 60.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join()
        self._socket.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LoopServer:
    """Serves an ASGI app on the *current* event loop (no thread), for callers whose loop
    already owns the objects the app uses: ``url = await server.start()``, ``await server.stop()``.
    """

    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        unix_socket: bool = False,
        limits: ServerLimits | None = None,
    ) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        bound_host, bound_port = self._socket.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        self._sockets = [self._socket]
        #: With ``unix_socket``, also served on this Unix socket (in a private folder removed at
        #: ``stop``): the way out of network-isolated sandboxes.
        self.unix_path: str | None = None
        if unix_socket:
            # Marked as ours: a killed client's is removed by the next (rollway.tempdirs).
            self.unix_path = str(make_owned_tempdir("rollway-gw-") / "gateway.sock")
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(self.unix_path)
            self._sockets.append(unix)
        config = uvicorn_config(app, limits or ServerLimits(), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        self._task = asyncio.create_task(self._server.serve(sockets=self._sockets))
        while not self._server.started:  # uvicorn offers no started event: poll it
            if self._task.done():
                await self._task
                raise RuntimeError("the server did not start")
            await asyncio.sleep(0.01)
        return self.url

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            await self._task
        for sock in self._sockets:
            sock.close()
        if self.unix_path is not None:
            shutil.rmtree(os.path.dirname(self.unix_path), ignore_errors=True)
