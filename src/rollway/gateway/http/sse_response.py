"""Server-sent events of a streamed turn: the response starts once the turn's first piece is
there (an error before it is an ordinary HTTP error), an error after it is the API's own error
event, and a client that goes away closes the turn's stream, which aborts its generation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from rollway.errors import RollwayError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How one API writes an error that happened after its stream began.
ErrorEvent = Callable[[RollwayError], bytes]


async def first_awaited(pieces: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """``pieces`` with its first item already awaited here, so that what fails before any
    byte is sent raises from this call."""
    first = await anext(pieces)

    async def resumed() -> AsyncGenerator[T, None]:
        async with contextlib.aclosing(pieces):
            yield first
            async for piece in pieces:
                yield piece

    return resumed()


class EventStream(StreamingResponse):
    """An SSE response whose events end with ``error_event`` if producing them fails, and whose
    producer is closed however the response ends (a disconnect cancels the sending)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncGenerator[bytes, None], error_event: ErrorEvent) -> None:
        self._events = events
        # Kept as the generator it is: ``body_iterator`` is typed as any async iterable.
        self._body = _ending_in_error(events, error_event)
        super().__init__(self._body)

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._body.aclose()
                await self._events.aclose()


async def _ending_in_error(
    events: AsyncIterator[bytes], error_event: ErrorEvent
) -> AsyncGenerator[bytes, None]:
    try:
        async for event in events:
            yield event
    except RollwayError as exc:
        yield error_event(exc)
    except Exception as exc:
        log.exception("a streamed answer failed")
        yield error_event(RollwayError(f"internal error: {type(exc).__name__}"))
