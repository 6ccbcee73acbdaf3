"""The one error tree of rollway.

Every error raised on purpose is a ``RollwayError``. Categories map to rollout outcomes and,
in ``HTTP_STATUS`` below (the only place), to HTTP status codes::

    RollwayError
    ├── ConfigError                 bad configuration or model path          (500)
    ├── RequestError                a caller sent something wrong            (400)
    │   ├── MalformedBodyError      body is not valid JSON                   (400)
    │   ├── InvalidFieldsError      JSON is fine, fields are not             (422)
    │   ├── PayloadTooLargeError    body exceeds the size limit              (413)
    │   └── UnsupportedMediaTypeError  body is not declared application/json (415)
    ├── AuthError                   missing or wrong key                     (401)
    ├── UnknownRolloutError         no such rollout registered               (404)
    ├── RolloutClosedError          rollout cancelled or already registered  (409)
    ├── ExperimentInUseError        another live client holds the experiment (409)
    ├── EngineError                 the engine failed to generate            (502)
    │   └── EngineConnectError      the engine cannot be reached (an outage) (503)
    ├── AgentError                  the agent failed or is malformed         (500)
    ├── RewardError                 the reward function failed               (500)
    │   └── JudgeAnswerError        a judge's answer held no score (retried) (500)
    ├── StoredDataError             a stored file or object is unusable      (500)
    │   └── BadRecordError          a rollout's record: unreadable, invalid or misaligned
    └── InfrastructureError         a transient failure; the client retries  (503)
        └── OverloadedError         at capacity now; try again later         (429)

Rollout outcomes use the same categories: an ``error`` outcome has a kind of ``agent``,
``engine``, ``reward`` or ``infrastructure`` (see ``error_kind``).

Exceptions keep their constructor arguments in ``args`` so that they pickle (they cross Ray).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Literal


class RollwayError(Exception):
    """Root of every error rollway raises on purpose."""

    #: OpenAI-style error ``type`` in HTTP error bodies.
    error_type = "internal_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, param)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


class ConfigError(RollwayError):
    error_type = "config_error"


class RequestError(RollwayError):
    error_type = "invalid_request_error"


class MalformedBodyError(RequestError):
    pass


class InvalidFieldsError(RequestError):
    pass


class PayloadTooLargeError(RequestError):
    pass


class UnsupportedMediaTypeError(RequestError):
    pass


class AuthError(RollwayError):
    error_type = "authentication_error"


class UnknownRolloutError(RollwayError):
    error_type = "not_found_error"


class RolloutClosedError(RollwayError):
    error_type = "conflict_error"


class ExperimentInUseError(RollwayError):
    """Another live client holds the experiment's lease (``rollway.leases``): two clients
    would run, cancel and unregister the same rollouts."""

    error_type = "conflict_error"


class EngineError(RollwayError):
    error_type = "engine_error"


class EngineConnectError(EngineError):
    pass


class AgentError(RollwayError):
    error_type = "agent_error"


class RewardError(RollwayError):
    error_type = "reward_error"


class JudgeAnswerError(RewardError):
    """A judge's answer held no score its parser could read: the message quotes the answer.
    Unlike other reward errors it is tried again (a sampled judge may answer better)."""


class StoredDataError(RollwayError):
    """A file or object in a store cannot be used as it is (a lease nobody can read, a record
    that is not one): the message names it and the fix."""

    error_type = "stored_data_error"


class BadRecordError(StoredDataError):
    """A rollout's record that cannot be used. ``where`` names it (the file, the object's URI,
    or the rollout), ``reason`` says what is wrong with it (never its bytes), ``key`` (the
    ``param``) is its rollout key where known. Readers report it by name and go on: export
    skips it, resume runs the rollout again, the viewer lists it as unreadable."""

    def __init__(
        self, message: str, param: str | None = None, where: str = "", reason: str = ""
    ) -> None:
        super().__init__(message, param)
        self.args = (message, param, where, reason)
        self.where, self.reason = where or message, reason or message

    @classmethod
    def of(cls, where: str, reason: str, key: str | None = None) -> BadRecordError:
        return cls(f"{where}: {reason}", key, where, reason)

    @property
    def key(self) -> str | None:
        return self.param


class InfrastructureError(RollwayError):
    error_type = "infrastructure_error"


class OverloadedError(InfrastructureError):
    """A server is at its concurrency cap; ``retry_after_s`` says when to come back."""

    error_type = "rate_limit_error"

    def __init__(self, message: str, param: str | None = None, retry_after_s: float = 1.0) -> None:
        super().__init__(message, param)
        self.args = (message, param, retry_after_s)
        self.retry_after_s = retry_after_s


HTTP_STATUS: dict[type[RollwayError], int] = {
    RollwayError: 500,
    ConfigError: 500,
    RequestError: 400,
    MalformedBodyError: 400,
    InvalidFieldsError: 422,
    PayloadTooLargeError: 413,
    UnsupportedMediaTypeError: 415,
    AuthError: 401,
    UnknownRolloutError: 404,
    RolloutClosedError: 409,
    ExperimentInUseError: 409,
    EngineError: 502,
    EngineConnectError: 503,
    AgentError: 500,
    RewardError: 500,
    JudgeAnswerError: 500,
    StoredDataError: 500,
    BadRecordError: 500,
    InfrastructureError: 503,
    OverloadedError: 429,
}


_BY_NAME = {cls.__name__: cls for cls in HTTP_STATUS}


def http_status_for(error: RollwayError) -> int:
    """The HTTP status for an error: its own class's entry, else its nearest ancestor's."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


#: What an ``error`` outcome was: the categories above (``error_kind`` maps an exception).
ErrorKind = Literal["agent", "engine", "reward", "infrastructure"]
#: Outcome kinds that say nothing about the policy: the client retries them (new attempt),
#: resume reruns them, and group statistics leave them out. An engine failure is one: the
#: server crashed or was cut off mid-turn (a turn that may have reached it is never re-sent,
#: but the rollout can be run again from the start).
TRANSIENT_KINDS = frozenset({"infrastructure", "engine"})


def error_kind(error: BaseException) -> ErrorKind:
    """The outcome kind of an exception raised while a rollout ran: anything that is not a
    known engine, reward or infrastructure error is the agent's."""
    if isinstance(error, EngineError):
        return "engine"
    if isinstance(error, RewardError):
        return "reward"
    if isinstance(error, InfrastructureError):
        return "infrastructure"
    return "agent"


def is_failure(error: BaseException) -> bool:
    """Whether an exception from user code (an agent, a tool, a reward function) is a failure
    to record like any other. ``sys.exit()`` is one: let through, asyncio re-raises it out of
    the event loop that runs every rollout. A cancellation is not, nor is Ctrl-C: that belongs
    to whoever pressed it. Ctrl-C lands only on the main thread, so a ``KeyboardInterrupt``
    raised on another (the client's loop thread, a worker) is user code's own: a failure.
    Likewise a ``CancelledError`` while nothing cancels the running task (``cancelling()`` is
    0), or on a thread without an event loop, is user code's own: let through, it would end
    the rollout's task and raise out of the whole batch."""
    if isinstance(error, asyncio.CancelledError):
        return not _being_cancelled()
    if isinstance(error, KeyboardInterrupt):
        return threading.current_thread() is not threading.main_thread()
    return True


def _being_cancelled() -> bool:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop on this thread: nothing can cancel it
        return False
    return task is not None and task.cancelling() > 0


def error_from_body(status: int, body: object) -> RollwayError:
    """The error a rollway server answered with, rebuilt from its body (``error.code`` names
    the class); a body from anything else becomes a ``RequestError`` for a 4xx and an
    ``InfrastructureError`` otherwise."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or f"HTTP {status}")
        param = error.get("param") if isinstance(error.get("param"), str) else None
        cls = _BY_NAME.get(str(error.get("code")))
        if cls is not None:
            return cls(message, param)
    else:
        message = f"HTTP {status}: {str(body)[:200]}"
    return RequestError(message) if 400 <= status < 500 else InfrastructureError(message)
