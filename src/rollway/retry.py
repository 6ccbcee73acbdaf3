"""Retry policies: how many tries, how long between them, and what is worth another try.

Every retry loop in rollway runs a named policy, through the tenacity loop the policy builds
(``policy.retrying()``), instead of counting and sleeping by hand. Each named policy lives
beside its owner: ``ENGINE_CONNECT`` (engines.remote.connection), ``AGENT_INIT``
(agents.server.remote_agent), ``REPORT_DELIVERY`` (agents.server.report_sender),
``ROLLOUT_ATTEMPTS`` (rollouts.config), ``REWARD_TRIES`` (rollouts.rewards),
``WORKER_REDISPATCH`` (executors.ray_executor) and ``WORKER_RESTART`` (executors.ray_workers).
A policy whose numbers come from configuration is the
named one with those numbers replaced (``dataclasses.replace(ROLLOUT_ATTEMPTS,
attempts=n)``); one whose retryable errors are private to its caller or imported late (the Ray
executor's) gets them where it is used.

Loops that are not retries have no policy: health checks and expiry sweeps on a timer, a
router failing over to the next server (bounded by the fleet, not a count), a client starting
a stale rollout again after a weight update, polls for a state change with a deadline.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, after_nothing, stop_before_delay

from rollway.checks import check_count, check_seconds, is_number
from rollway.errors import TRANSIENT_KINDS, ConfigError, OverloadedError

Hook = Callable[[RetryCallState], None]


@dataclass(frozen=True)
class Backoff:
    """Waits that grow: ``first_s`` before the first retry, ``factor`` times longer before
    each next one, never longer than ``max_s`` (``factor=1``: the same wait every time)."""

    first_s: float
    factor: float = 2.0
    max_s: float = 30.0

    def __post_init__(self) -> None:
        check_seconds("first_s", self.first_s, zero=True, finite=True)
        check_seconds("max_s", self.max_s, zero=True, finite=True)
        if not (is_number(self.factor) and 1 <= self.factor < math.inf):
            raise ConfigError("factor must be a finite number of at least 1", "factor")

    def delay_s(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1: the first retry)."""
        try:
            return min(self.first_s * self.factor ** (retry - 1), self.max_s)
        except OverflowError:  # a poll that has gone on for hours
            return self.max_s

    def delays_s(self) -> Iterator[float]:
        """Every wait in turn, without end (for a poll)."""
        return (self.delay_s(retry) for retry in itertools.count(1))


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed try goes again.

    A try that raised one of ``retry_on``, or (with ``retry_result``) returned a result it
    calls retryable, goes again after the ``backoff`` wait (at once without one), until
    ``attempts`` tries in all have failed or ``within_s`` seconds would have passed since the
    first. Then the loop gives back what its last try gave: that exception raised, or that
    result returned. With ``wait_out_overload``, an ``OverloadedError`` (a server at capacity
    that said when to come back) waits its ``retry_after_s`` and does not count as a try: the
    server is up, and a caller's timeout or cancel bounds the wait.
    """

    attempts: int | None = None
    backoff: Backoff | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    retry_result: Callable[[Any], bool] | None = None
    within_s: float | None = None
    wait_out_overload: bool = False

    def __post_init__(self) -> None:
        check_count("attempts", self.attempts, least=1, optional=True)
        if self.backoff is not None and not isinstance(self.backoff, Backoff):
            raise ConfigError("backoff must be a Backoff or None", "backoff")
        if self.within_s is not None and not (is_number(self.within_s) and self.within_s > 0):
            raise ConfigError("within_s must be None or a positive number of seconds", "within_s")

    def is_retryable(self, error: BaseException) -> bool:
        return isinstance(error, self.retry_on)

    def waits_out(self, error: BaseException | None) -> bool:
        """Whether ``error`` is an overload this policy waits out, uncounted."""
        return self.wait_out_overload and isinstance(error, OverloadedError)

    def retrying(
        self,
        *,
        give_up: Callable[[], bool] | None = None,
        after: Hook | None = None,
        before_sleep: Hook | None = None,
    ) -> AsyncRetrying:
        """A tenacity loop for one operation (it counts that operation's failed tries, so
        build one per operation). ``give_up`` is asked after each failed try; true (a cancel)
        ends the loop there with that try's outcome. ``after`` runs after each failed try
        that is retryable, ``before_sleep`` before each wait."""
        tries = _Tries(self, give_up)
        return AsyncRetrying(
            retry=tries.retry,
            stop=tries.stop,
            wait=tries.wait,
            after=after or after_nothing,
            before_sleep=before_sleep,
            retry_error_callback=_last_outcome,
        )


class _Tries:
    """One loop's count of the failed tries that count (an overload waited out does not).
    tenacity asks ``retry`` once per finished try, before ``wait`` and ``stop``."""

    def __init__(self, policy: RetryPolicy, give_up: Callable[[], bool] | None) -> None:
        self.policy, self.give_up = policy, give_up
        self.failed = 0
        within_s = policy.within_s
        self._deadline = None if within_s is None else stop_before_delay(within_s)

    def retry(self, state: RetryCallState) -> bool:
        outcome = state.outcome
        assert outcome is not None
        error = outcome.exception() if outcome.failed else None
        if error is not None:
            again = self.policy.is_retryable(error)
        else:
            judge = self.policy.retry_result
            again = judge is not None and judge(outcome.result())
        if again and self.give_up is not None and self.give_up():
            return False
        if again and not self.policy.waits_out(error):
            self.failed += 1
        return again

    def wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome and state.outcome.failed else None
        if isinstance(error, OverloadedError) and self.policy.waits_out(error):
            return error.retry_after_s
        backoff = self.policy.backoff
        return 0.0 if backoff is None else backoff.delay_s(self.failed)

    def stop(self, state: RetryCallState) -> bool:
        attempts = self.policy.attempts
        if attempts is not None and self.failed >= max(1, attempts):
            return True
        return self._deadline is not None and self._deadline(state)


def _last_outcome(state: RetryCallState) -> Any:
    assert state.outcome is not None
    return state.outcome.result()  # raises the last try's exception, if it raised


class _Outcome(Protocol):
    @property
    def error_kind(self) -> str | None: ...


def is_transient(outcome: _Outcome) -> bool:
    """An outcome that says nothing about the policy (see ``errors.TRANSIENT_KINDS``)."""
    return outcome.error_kind in TRANSIENT_KINDS
