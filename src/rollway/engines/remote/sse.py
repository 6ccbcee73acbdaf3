"""Server-sent events from a remote engine: the streamed twin of ``RemoteClient.send``.

``EventStream`` POSTs a JSON body (``"stream": true``) and hands out each ``data:`` event's JSON
until ``data: [DONE]``, under ``RemoteClient``'s rules: a request that never left (no TCP
connection) is retried once with the same id, then is an ``EngineConnectError``; once sent, any
failure (an HTTP error status, a connection cut mid-stream, a garbled event, a stream that ends
without ``[DONE]``) aborts the request by its id and is an ``EngineError`` naming what happened;
cancellation aborts too. ``cut()`` ends a stream on purpose (the abort of servers that abort on
disconnect): its reader then stops quietly.

Events are split on blank lines from raw chunks, not read line by line: SGLang's default stream
repeats the whole output and its logprobs in every event, so one line outgrows aiohttp's 64 KiB
line limit after a few thousand tokens.

It uses the pooled session, headers and connect-retry loop of the engine's ``RemoteClient``
(``connection.py``), whose non-streamed path this module leaves untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
import orjson

from rollway.engines.remote.connection import ENGINE_CONNECT, Abort, RemoteClient
from rollway.errors import EngineConnectError, EngineError

log = logging.getLogger(__name__)

_DONE = b"[DONE]"
_ABORT_TIMEOUT_S = 5.0


class EventStream:
    """One streamed request: ``async for event in stream.events()``, once."""

    def __init__(self, http: RemoteClient, url: str, payload: dict[str, Any], abort: Abort):
        self.http = http
        self.url = url
        self.payload = payload
        self.abort = abort
        #: Events handed out so far (error messages say how far the stream got).
        self.received = 0
        self._response: aiohttp.ClientResponse | None = None
        self._cut = False

    def cut(self) -> None:
        """End the stream now (the connection is dropped); its reader stops without error."""
        self._cut = True
        if self._response is not None:
            self._response.close()

    async def events(self) -> AsyncGenerator[Any, None]:
        """Each event's decoded JSON, up to ``[DONE]`` (not included)."""
        try:
            response = await self._open()
            if self._cut:
                return
            async for event in self._read(response):
                self.received += 1
                yield event
        except asyncio.CancelledError:
            await self._abort_quietly()
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            if self._cut:
                return
            await self._abort_quietly()
            raise EngineError(
                f"{self.url}: the stream broke after {self.received} events: {exc!r}"
            ) from exc
        finally:
            if self._response is not None:
                self._response.release()

    async def _open(self) -> aiohttp.ClientResponse:
        data = orjson.dumps(self.payload)
        try:
            response = await self.http.open_stream(self.url, data)
        except ENGINE_CONNECT.retry_on as exc:
            raise EngineConnectError(f"cannot connect to {self.url}: {exc}") from exc
        self._response = response
        if response.status >= 400:
            body = await response.read()
            if response.status < 500:
                raise EngineError(
                    f"{self.url} refused the request: HTTP {response.status} {body[:300]!r}"
                )
            await self._abort_quietly()  # a 5xx may have run it
            raise EngineError(
                f"{self.url} failed after sending: HTTP {response.status} {body[:300]!r}"
            )
        return response

    async def _read(self, response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
        pending = b""
        async for raw in response.content.iter_any():
            # Only the unfinished event is kept (and scanned again as more of it comes).
            pending = (pending + raw).replace(b"\r\n", b"\n")
            *events, pending = pending.split(b"\n\n")
            for event in events:
                data = _data_of(event)
                if data == _DONE:
                    return
                if data is not None:
                    yield orjson.loads(data)
        if not self._cut:
            await self._abort_quietly()
            raise EngineError(
                f"{self.url}: the stream ended without [DONE] after {self.received} events "
                "(the connection was closed mid-stream)"
            )

    async def _abort_quietly(self) -> None:
        try:
            await asyncio.wait_for(self.abort(), _ABORT_TIMEOUT_S)
        except Exception as exc:
            log.warning("abort failed: %r", exc)


def _data_of(event: bytes) -> bytes | None:
    """The ``data`` of one event (its ``data:`` lines joined); None for comments only."""
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[5:].removeprefix(b" ") for line in lines)


class StreamCuts:
    """The running streams of an engine whose server aborts a request when its client
    disconnects (vLLM): ``cut(request_id)`` drops that stream's connection."""

    def __init__(self) -> None:
        self._streams: dict[str, EventStream] = {}
        self.cut_ids: set[str] = set()

    def add(self, request_id: str, stream: EventStream) -> None:
        self._streams[request_id] = stream
        self.cut_ids.discard(request_id)

    def remove(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.cut_ids.discard(request_id)

    def cut(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            self.cut_ids.add(request_id)
            stream.cut()
