"""How rollway's HTTP servers run under uvicorn, so that they can face a network
(``--host 0.0.0.0``): a deadline to send each request, an idle keep-alive timeout, and a cap
on connections.

uvicorn has no timeout on *reading* a request: ``timeout_keep_alive`` starts only after a
response and stops at the next byte, so a client that connects and sends nothing, or trickles
its headers a byte at a time, holds a connection and a file descriptor forever; a few hundred
such clients starve the server. ``RequestDeadlineProtocol`` adds that deadline.
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass
from typing import Any, ClassVar

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True)
class ServerLimits:
    #: Seconds a client has to send a whole request (headers and body), counted from when
    #: the server starts waiting for it (the connection, or the previous answer); then the
    #: connection is closed. Answers may take as long as they need.
    request_timeout_s: float = 30.0
    #: Seconds an idle connection is kept open between requests.
    keep_alive_s: float = 5.0
    #: Connections (and requests in progress) at once; beyond, requests get a 503.
    max_connections: int = 4096


class RequestDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on receiving each request. The timer runs
    whenever the server waits for request bytes, and stops while a fully received request is
    being answered, so long (streamed) answers are never cut."""

    request_timeout_s: ClassVar[float] = ServerLimits.request_timeout_s

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._received = 0  # requests fully received
        self._answered = 0  # responses completed

    # uvicorn's own annotation: an asyncio.Transport, narrower than BaseProtocol's.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_complete(self) -> None:
        self._received += 1
        self._arm_if_waiting()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._answered += 1
        super().on_response_complete()
        self._arm_if_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm_if_waiting(self) -> None:
        # An answer may go out before its body is read (a 401): then the server waits again.
        if self._received > self._answered:
            self._disarm()
        else:
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.request_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: ASGIApp, limits: ServerLimits, **options: Any) -> uvicorn.Config:
    """A uvicorn config for ``app`` under ``limits``; ``options`` go to ``uvicorn.Config``."""
    protocol = type(
        "RequestDeadlineProtocol",
        (RequestDeadlineProtocol,),
        {"request_timeout_s": limits.request_timeout_s},
    )
    defaults: dict[str, Any] = {
        # uvicorn formats each access-log line's arguments (client address, path) before the
        # logger drops it, and rollway's servers log at warning: no line was ever printed.
        "access_log": False,
        # One header less to validate and write per answer, and nothing said about the stack.
        "server_header": False,
    }
    return uvicorn.Config(
        app,
        http=protocol,
        # uvicorn annotates int, but hands it to loop.call_later: fractions of a second work.
        timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
        limit_concurrency=limits.max_connections,
        **(defaults | options),
    )


#: The young generation's threshold for a serving process (CPython's default is 700 objects).
SERVING_GC_THRESHOLD = (50_000, 20, 100)


def tune_collector_for_serving() -> None:
    """Make the garbage collector cheap for a long-lived server: what start-up made (a
    tokenizer, the libraries: hundreds of thousands of objects) is frozen out of every later
    collection, and young collections run less often. Requests waiting on an engine keep their
    objects alive long enough to be promoted, which under CPython's defaults made a third of a
    gateway's CPU per turn go to collections that found nothing to free."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLD)


def run_server(app: ASGIApp, limits: ServerLimits, *, host: str, port: int) -> None:
    """Serve ``app`` until interrupted (the CLI's servers)."""
    tune_collector_for_serving()
    uvicorn.Server(uvicorn_config(app, limits, host=host, port=port, log_level="warning")).run()
