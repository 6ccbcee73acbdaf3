"""The named retry policies themselves: waits that grow and cap, a stop after N tries, what is
retryable, overloads waited out uncounted, and what the loop gives back at its end."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import pytest

from rollway.agents.server.remote_agent import AGENT_INIT
from rollway.agents.server.report_sender import REPORT_DELIVERY
from rollway.engines.remote.connection import ENGINE_CONNECT
from rollway.errors import (
    ConfigError,
    EngineError,
    InfrastructureError,
    OverloadedError,
    RequestError,
)
from rollway.executors.ray_executor import WORKER_RESTART
from rollway.retry import Backoff, RetryPolicy
from rollway.rollouts.config import ROLLOUT_ATTEMPTS


class Script:
    """A try that raises or returns the next of ``outcomes`` (then returns "ok"), and a sleep
    that records its waits instead of waiting."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.tries = 0
        self.waits: list[float] = []

    async def attempt(self) -> Any:
        self.tries += 1
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)

    async def run(self, policy: RetryPolicy, **options: Any) -> Any:
        retrying = policy.retrying(**options).copy(sleep=self.sleep)
        return await retrying(self.attempt)


@dataclasses.dataclass
class Record:
    error_kind: str | None


def test_waits_grow_by_the_factor_and_stop_at_the_cap() -> None:
    backoff = Backoff(first_s=0.5, factor=2.0, max_s=3.0)
    waits = backoff.delays_s()
    assert [next(waits) for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert Backoff(first_s=0.5, factor=1.0).delay_s(40) == 0.5
    assert backoff.delay_s(5000) == 3.0  # past a float's range: the cap, not an overflow


async def test_a_retryable_error_is_tried_n_times_then_raised_as_itself() -> None:
    policy = RetryPolicy(attempts=3, backoff=Backoff(first_s=0.5), retry_on=(EngineError,))
    errors = [EngineError(f"fail {n}") for n in range(5)]
    script = Script(*errors)
    with pytest.raises(EngineError) as raised:
        await script.run(policy)
    assert raised.value is errors[2]  # the last try's own error, not a RetryError
    assert script.tries == 3
    assert script.waits == [0.5, 1.0]


async def test_an_error_that_is_not_retryable_ends_the_loop_at_once() -> None:
    policy = RetryPolicy(attempts=5, retry_on=(InfrastructureError,))
    script = Script(RequestError("bad"))
    with pytest.raises(RequestError):
        await script.run(policy)
    assert script.tries == 1 and script.waits == []
    assert policy.is_retryable(OverloadedError("busy"))  # a subclass is retryable too
    assert not policy.is_retryable(ValueError("bug"))


async def test_a_success_after_failures_is_returned() -> None:
    policy = RetryPolicy(attempts=3, retry_on=(InfrastructureError,))
    script = Script(InfrastructureError("down"), InfrastructureError("down"), "done")
    assert await script.run(policy) == "done"
    assert script.tries == 3 and script.waits == [0.0, 0.0]  # no backoff: again at once


async def test_overloads_wait_their_retry_after_and_do_not_use_up_tries() -> None:
    policy = RetryPolicy(
        attempts=3, backoff=Backoff(first_s=1.0), retry_on=(InfrastructureError,),
        wait_out_overload=True,
    )  # fmt: skip
    down = InfrastructureError("down")
    busy = OverloadedError("busy", retry_after_s=7.0)
    script = Script(busy, down, busy, busy, down, busy, down, "never reached")
    with pytest.raises(InfrastructureError) as raised:
        await script.run(policy)
    assert raised.value is down and script.tries == 7  # the third failure ends it
    # Each failure's wait follows its own count, whatever overloads came between.
    assert script.waits == [7.0, 1.0, 7.0, 7.0, 2.0, 7.0]


async def test_without_wait_out_an_overload_is_a_try_like_any_other() -> None:
    policy = RetryPolicy(attempts=2, backoff=Backoff(first_s=1.0), retry_on=(InfrastructureError,))
    script = Script(OverloadedError("busy", retry_after_s=7.0), OverloadedError("busy"))
    with pytest.raises(OverloadedError):
        await script.run(policy)
    assert script.tries == 2 and script.waits == [1.0]


async def test_a_retryable_result_is_tried_again_and_the_last_one_returned() -> None:
    policy = dataclasses.replace(ROLLOUT_ATTEMPTS, backoff=Backoff(first_s=0.25))
    transient = [Record("engine"), Record("infrastructure"), Record("engine")]
    script = Script(*transient)
    assert await script.run(policy) is transient[2]
    assert script.tries == 3 and script.waits == [0.25, 0.5]
    final = Record("agent")  # says something about the policy: kept as it is
    script = Script(Record("infrastructure"), final)
    assert await script.run(policy) is final and script.tries == 2


async def test_give_up_ends_the_loop_with_the_last_outcome() -> None:
    cancelled = False

    async def attempt() -> Record:
        nonlocal cancelled
        cancelled = True  # the caller cancels while the first try runs
        return Record("infrastructure")

    retrying = ROLLOUT_ATTEMPTS.retrying(give_up=lambda: cancelled)
    record = await retrying(attempt)
    assert record.error_kind == "infrastructure"
    assert retrying.statistics["attempt_number"] == 1


async def test_within_s_stops_before_a_wait_that_would_pass_it() -> None:
    policy = RetryPolicy(backoff=Backoff(first_s=5.0, factor=1.0), within_s=1.0,
                         retry_on=(TimeoutError,))  # fmt: skip
    script = Script(TimeoutError(), TimeoutError())
    with pytest.raises(TimeoutError):
        await script.run(policy)
    assert script.tries == 1 and script.waits == []


async def test_each_loop_counts_its_own_tries() -> None:
    policy = RetryPolicy(attempts=2, retry_on=(InfrastructureError,))
    for _ in range(2):  # a second operation starts again from its first try
        script = Script(InfrastructureError("down"), "ok")
        assert await script.run(policy) == "ok"
        assert script.tries == 2


async def test_hooks_see_every_failed_try_and_every_wait() -> None:
    failed: list[int] = []
    slept: list[int] = []
    script = Script(InfrastructureError("a"), InfrastructureError("b"))
    policy = RetryPolicy(attempts=2, retry_on=(InfrastructureError,))
    with pytest.raises(InfrastructureError):
        await script.run(
            policy,
            after=lambda state: failed.append(state.attempt_number),
            before_sleep=lambda state: slept.append(state.attempt_number),
        )
    assert failed == [1, 2] and slept == [1]


@pytest.mark.parametrize(
    ("policy", "error", "retryable"),
    [
        (ENGINE_CONNECT, aiohttp.ConnectionTimeoutError(), True),
        (ENGINE_CONNECT, aiohttp.ServerDisconnectedError(), False),  # it may have run
        (ENGINE_CONNECT, TimeoutError(), False),
        (AGENT_INIT, InfrastructureError("down"), True),
        (AGENT_INIT, RequestError("bad init"), False),
        (REPORT_DELIVERY, InfrastructureError("HTTP 503"), True),
        (REPORT_DELIVERY, RequestError("HTTP 404"), False),
    ],
)
def test_what_each_named_policy_retries(
    policy: RetryPolicy, error: BaseException, retryable: bool
) -> None:
    assert policy.is_retryable(error) is retryable


def test_the_named_policies_keep_their_numbers() -> None:
    assert ENGINE_CONNECT.attempts == 2 and ENGINE_CONNECT.backoff is None
    assert AGENT_INIT.attempts == 3 and AGENT_INIT.wait_out_overload
    assert REPORT_DELIVERY.attempts == 5 and REPORT_DELIVERY.backoff == Backoff(0.5, 2.0, 30.0)
    assert ROLLOUT_ATTEMPTS.attempts == 3 and ROLLOUT_ATTEMPTS.backoff == Backoff(0.5, 2.0, 30.0)
    assert WORKER_RESTART.backoff == Backoff(0.5, 1.0) and WORKER_RESTART.within_s == 120.0


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: RetryPolicy(attempts=0), "attempts"),
        (lambda: RetryPolicy(attempts=-1), "attempts"),
        (lambda: RetryPolicy(attempts="3"), "attempts"),
        (lambda: RetryPolicy(attempts=True), "attempts"),
        (lambda: RetryPolicy(within_s=0), "within_s"),
        (lambda: RetryPolicy(within_s=float("nan")), "within_s"),
        (lambda: RetryPolicy(backoff=0.5), "backoff"),
        (lambda: Backoff(first_s=-5), "first_s"),
        (lambda: Backoff(first_s=float("nan")), "first_s"),
        (lambda: Backoff(first_s=float("inf")), "first_s"),
        (lambda: Backoff(first_s="1"), "first_s"),
        (lambda: Backoff(first_s=1, max_s=-1), "max_s"),
        (lambda: Backoff(first_s=1, factor=0.5), "factor"),
        (lambda: Backoff(first_s=1, factor=float("nan")), "factor"),
    ],
)
def test_a_bad_policy_field_is_refused_naming_it(make: Any, field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field} must be") as raised:
        make()
    assert raised.value.param == field


def test_the_edges_of_a_policy_are_allowed() -> None:
    assert RetryPolicy(attempts=1, within_s=0.1).attempts == 1
    assert Backoff(first_s=0, factor=1, max_s=0).delay_s(3) == 0
