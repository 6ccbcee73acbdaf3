"""The connection discipline every remote engine follows.

One pooled aiohttp session per engine (opened on first use, closed with the engine), limits
set for thousands of concurrent requests. A request that failed before it was sent (connection
refused or reset at connect, DNS, no TCP connection within ``connect_timeout_s``) is retried
exactly once with the same request id, then fails as an ``EngineConnectError``; a routed fleet
sets ``connect_attempts=1`` and sends it to another server instead (``engines/remote/router.py``). A
request that may have reached the server (disconnect mid-request, timeout, HTTP 5xx, a garbled
body) is never retried: it is aborted by its request id and fails as an ``EngineError``.
Cancellation aborts too. Control calls that are safe to repeat (``call(..., repeatable=True)``:
health, resume, weight info, models) go once more on a connection the server had closed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
import yarl
from tenacity import AsyncRetrying, RetryCallState

from rollway import tracing
from rollway.errors import EngineConnectError, EngineError
from rollway.retry import RetryPolicy

#: A request to a remote engine goes again once when it never left (no TCP connection): it
#: cannot have run, so the same request id is safe. A routed fleet sets ``attempts=1`` and
#: sends it to another server instead.
ENGINE_CONNECT = RetryPolicy(
    attempts=2, retry_on=(aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
)

log = logging.getLogger(__name__)

Abort = Callable[[], Awaitable[None]]
#: How long an idle pooled connection is kept. Below the servers' own idle limit (uvicorn's
#: ``timeout_keep_alive``, 5 s, which SGLang and vLLM keep): a connection the server is closing
#: as it is reused fails mid-request, and such a request may have run, so it is not retried.
IDLE_CLOSE_S = 3.0
_ABORT_TIMEOUT_S = 5.0
#: Failures that prove nothing was sent: the TCP connection was never made.
_NOT_SENT = ENGINE_CONNECT.retry_on
#: A pooled connection the server had closed: uvicorn (vLLM, SGLang) closes one after an
#: unhandled error's 500 without ``Connection: close``, so the next call on it is cut.
_CLOSED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


@functools.lru_cache(maxsize=1024)
def _parsed(url: str) -> yarl.URL:
    """An engine's few URLs parsed once: aiohttp parses a string URL on every request."""
    return yarl.URL(url)


class _MayHaveRun(Exception):
    """The server answered with a 5xx: the generation may have happened."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A control call's answer: the status, the JSON body (None when empty or not JSON) and the
    start of the raw body (for messages)."""

    status: int
    body: Any
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class RemoteClient:
    def __init__(
        self,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        connect_attempts: int | None = None,
        max_connections: int = 4096,
        bearer: str | None = None,
        idle_close_s: float = IDLE_CLOSE_S,
    ) -> None:
        # sock_connect, not connect: waiting for a free pooled connection is not a dead server.
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
        #: Tries for a request that never left (``ENGINE_CONNECT``, or ``connect_attempts``).
        self.connect_policy = (
            ENGINE_CONNECT
            if connect_attempts is None
            else replace(ENGINE_CONNECT, attempts=connect_attempts)
        )
        self._headers = {"Content-Type": "application/json"}
        if bearer:
            self._headers["Authorization"] = f"Bearer {bearer}"
        self.max_connections = max_connections
        self.idle_close_s = idle_close_s
        #: Connection attempts that failed before a byte was sent (for tests and metrics).
        self.connect_failures = 0
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, keepalive_timeout=self.idle_close_s
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, url: str, payload: dict[str, Any], abort: Abort) -> Any:
        """POST ``payload`` as JSON and return the decoded answer, under the rules above."""
        data = orjson.dumps(payload)
        tracing.annotate({"rollway.engine.endpoint": url})
        try:
            return await self._post_retrying_connect(url, data)
        except _NOT_SENT as exc:
            raise EngineConnectError(f"cannot connect to {url}: {exc}") from exc
        except asyncio.CancelledError:
            await self._abort_quietly(abort)
            raise
        except (aiohttp.ClientError, TimeoutError, _MayHaveRun, ValueError) as exc:
            await self._abort_quietly(abort)
            raise EngineError(f"{url} failed after sending: {exc!r}") from exc
        raise AssertionError("unreachable")

    async def post_quietly(self, url: str, payload: dict[str, Any]) -> None:
        """Best effort (aborts): log failures, never raise them. The body is not read as JSON:
        SGLang's ``/abort_request`` answers 200 with an empty body."""
        try:
            await self._post(url, orjson.dumps(payload), decode=False)
        except Exception as exc:
            log.warning("best-effort call to %s failed: %r", url, exc)

    async def call(
        self,
        method: str,
        url: str,
        payload: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        retry_connect: bool = True,
        repeatable: bool = False,
    ) -> Answer:
        """One control call (a probe, a pause, a weight load). Any HTTP status comes back as an
        ``Answer``; a connect failure is retried once (unless ``retry_connect`` is false: a
        probe ahead of a request that retries on its own) and then is an
        ``EngineConnectError``; a failure after sending (timeout, cut connection) is an
        ``EngineError``. A ``repeatable`` call (health, resume, weight info, models: safe to
        run twice) is tried once more on a connection the server closed."""
        data = None if payload is None else orjson.dumps(payload)
        timeout = self.timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            try:
                return await self._call_retrying_connect(method, url, data, timeout, retry_connect)
            except _CLOSED as exc:
                if not repeatable or isinstance(exc, _NOT_SENT):
                    raise
                log.info(
                    "%s %s: the server had closed the connection (%r); again", method, url, exc
                )
            return await self._call_retrying_connect(method, url, data, timeout, retry_connect)
        except _NOT_SENT as exc:
            raise EngineConnectError(f"cannot connect to {url}: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineError(f"{method} {url} failed: {exc!r}") from exc

    async def _call_retrying_connect(
        self,
        method: str,
        url: str,
        data: bytes | None,
        limits: aiohttp.ClientTimeout,
        retry_connect: bool,
    ) -> Answer:
        if not retry_connect:
            return await self._call(method, url, data, limits=limits)
        async for attempt in self._connect_retries():
            with attempt:
                return await self._call(method, url, data, limits=limits)
        raise AssertionError("unreachable")

    async def get_ok(self, url: str, timeout_s: float = 5.0) -> bool:
        """True when ``url`` answers 2xx within ``timeout_s`` (health checks; tried once more
        on a connection the server had closed)."""
        try:
            answer = await self.call(
                "GET", url, timeout_s=timeout_s, retry_connect=False, repeatable=True
            )
        except EngineError:  # EngineConnectError included
            return False
        return answer.ok

    async def open_stream(self, url: str, data: bytes) -> aiohttp.ClientResponse:
        """POST ``data`` and return the response unread (a stream's events), its connection
        tried again like ``send``'s when it was never made; the caller releases it."""
        headers = tracing.headers(self._headers)  # traceparent, when tracing is on
        async for attempt in self._connect_retries():
            with attempt:
                return await self.session().post(_parsed(url), data=data, headers=headers)
        raise AssertionError("unreachable")

    async def _post_retrying_connect(self, url: str, data: bytes) -> Any:
        """``_post``, tried again under ``connect_policy`` when the connection was never made.
        The first try runs outside the retry loop: a tenacity loop costs tens of microseconds
        and some thirty objects in reference cycles (work for the garbage collector) per
        request, and almost no request needs one."""
        try:
            return await self._post(url, data)
        except _NOT_SENT as exc:
            self.connect_failures += 1
            attempts = self.connect_policy.attempts
            if attempts is not None and attempts <= 1:
                raise
            log.warning("connect failed, retrying once (same request, same id): %s", exc)
        # The tries left, counted and logged as if the loop had run from the first (the
        # connect policies go again at once: no backoff to carry over).
        policy = self.connect_policy
        if attempts is not None:
            policy = replace(policy, attempts=attempts - 1)
        async for attempt in self._connect_retries(policy):
            with attempt:
                return await self._post(url, data)
        raise AssertionError("unreachable")

    async def _post(self, url: str, data: bytes, *, decode: bool = True) -> Any:
        headers = tracing.headers(self._headers)  # traceparent, when tracing is on
        async with self.session().post(_parsed(url), data=data, headers=headers) as response:
            body = await response.read()
            if response.status >= 500:
                raise _MayHaveRun(f"HTTP {response.status}: {body[:200]!r}")
            if response.status >= 400:
                raise EngineError(
                    f"{url} refused the request: HTTP {response.status} {body[:300]!r}"
                )
            return orjson.loads(body) if decode else None

    async def _call(
        self, method: str, url: str, data: bytes | None, *, limits: aiohttp.ClientTimeout
    ) -> Answer:
        session = self.session()
        async with session.request(
            method, url, data=data, headers=self._headers, timeout=limits
        ) as response:
            raw = await response.read()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        return Answer(response.status, body, raw[:300].decode(errors="replace"))

    def _connect_retries(self, policy: RetryPolicy | None = None) -> AsyncRetrying:
        """Attempts that go again only when nothing was sent (no TCP connection)."""
        return (policy or self.connect_policy).retrying(
            after=self._count_connect_failure, before_sleep=_log_connect_retry
        )

    def _count_connect_failure(self, state: RetryCallState) -> None:
        self.connect_failures += 1

    @staticmethod
    async def _abort_quietly(abort: Abort) -> None:
        try:
            await asyncio.wait_for(abort(), _ABORT_TIMEOUT_S)
        except Exception as exc:
            log.warning("abort failed: %r", exc)


class DisconnectAbort:
    """For servers that abort a request when its client disconnects (vLLM, hosted APIs):
    ``abort`` cancels the HTTP call, which drops the connection."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._aborted: set[str] = set()

    async def send(
        self, http: RemoteClient, url: str, payload: dict[str, Any], request_id: str
    ) -> Any | None:
        """The answer, or None when ``abort`` cut the request off."""
        # A failed request's connection is already gone, which is these servers' abort.
        call = asyncio.create_task(http.send(url, payload, _already_disconnected))
        self._running[request_id] = call
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            if request_id in self._aborted:
                return None
            call.cancel()  # our caller was cancelled: drop the connection too
            raise
        finally:
            self._running.pop(request_id, None)
            self._aborted.discard(request_id)

    def abort(self, request_id: str) -> None:
        call = self._running.get(request_id)
        if call is not None and not call.done():
            self._aborted.add(request_id)
            call.cancel()


def token_cap(
    max_tokens: int | None, prompt_len: int, context_length: int | None, default_max_tokens: int
) -> int:
    """The explicit cap every remote request carries (servers default to 16 or 128 tokens):
    what is asked, no more than the room the context leaves; with nothing asked, that room;
    with neither known, ``default_max_tokens``."""
    room = None if context_length is None else max(context_length - prompt_len, 0)
    if max_tokens is None:
        return default_max_tokens if room is None else room
    return max_tokens if room is None else min(max_tokens, room)


async def served_context_length(http: RemoteClient, base_url: str) -> int | None:
    """The context length the server reports: ``max_model_len`` of the first model in
    ``GET /v1/models`` (vLLM and SGLang both give it); None when it says nothing usable."""
    answer = await http.call("GET", f"{base_url}/v1/models", timeout_s=10.0)
    try:
        length = answer.body["data"][0]["max_model_len"]
    except (KeyError, TypeError, IndexError):
        return None
    return length if isinstance(length, int) and length > 0 else None


def _log_connect_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning("connect failed, retrying once (same request, same id): %s", error)


async def _already_disconnected() -> None:
    return None


def most_likely(
    steps: list[list[tuple[float, int]]], top: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Per token, the ``top`` highest ``(logprob, id)`` pairs a server gave, most likely first,
    as ids and logprobs apart (a server may give more than asked, or in its own order). Fewer
    than ``top`` for a token is an ``EngineError``: a short row would be recorded as the
    distribution's head when it is not."""
    for at, step in enumerate(steps):
        if len(step) < top:
            raise EngineError(f"the server gave {len(step)} top logprobs for token {at}, not {top}")
    ordered = [sorted(step, reverse=True)[:top] for step in steps]
    return [[i for _, i in step] for step in ordered], [[lp for lp, _ in step] for step in ordered]
