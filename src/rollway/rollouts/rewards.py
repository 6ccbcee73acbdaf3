"""Run a reward function (sync or async) with its own timeout per try, so one slow scorer never
stalls the batch, and try again after a short wait when it raises or times out, so a flaky
grader (a judge behind a busy server, a sandboxed test run) costs a wait, not a sample. A
function returns a float, or a dict with a float ``reward`` and extras."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollway.checks import finite_float, is_number, shown_number
from rollway.errors import JudgeAnswerError, RewardError, is_failure
from rollway.retry import Backoff, RetryPolicy
from rollway.rollouts.reward_threads import REWARD_THREADS
from rollway.sandbox.environment import RolloutEnvironment, needs_environment
from rollway.trajectory import Trajectory

RewardFn = Callable[[dict[str, Any], Trajectory], Any]

log = logging.getLogger(__name__)

#: How long a try that timed out has to end once cancelled (the agent's ``stop_grace_s``).
CANCEL_GRACE_S = 2.0

#: Tries that ignored their cancel: held here (a task nothing references may be collected
#: mid-run) until they end, if they ever do.
_ABANDONED: set[asyncio.Task[Any]] = set()


def reward_identity(reward: Any) -> str:
    """A reward function by name (``module:qualname``), or a ``Rubric`` by its functions and
    weights: what a fingerprint and a rescored record say scored it."""
    identity = getattr(reward, "identity", None)
    if callable(identity):
        return str(identity())
    module = getattr(reward, "__module__", None) or "?"
    name = getattr(reward, "__qualname__", None) or type(reward).__qualname__
    return f"{module}:{name}"


#: Why a reward that uses the environment got none (not retried: it would get none again).
NO_ENVIRONMENT = (
    "reward function {name} uses the rollout's environment (@uses_environment), and this "
    "rollout has none: only a program agent's sandbox is lent to its reward, before teardown; "
    "a recorded rollout's is gone"
)


class _TryFailed(RewardError):
    """A try that raised or timed out: worth another. A value that is no reward is not (the
    function would return it again)."""


#: A reward function's tries: one that raised, timed out or got a judge answer it could not
#: read goes again after 0.5 s, then 1 s, ... (at most 5 s), up to
#: ``RolloutLimits.reward_retries`` times.
REWARD_TRIES = RetryPolicy(
    attempts=3,
    backoff=Backoff(first_s=0.5, max_s=5.0),
    retry_on=(_TryFailed, JudgeAnswerError),
)


@dataclass
class Scored:
    """What scoring gave: the reward and its extra fields, or the error that ended the last
    try; ``tries`` lists each try (its error, if it failed, and its time) when one failed."""

    reward: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    tries: list[dict[str, Any]] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        """The extras, with the tries when any failed (a first try that scored needs none)."""
        failed = any("error" in one for one in self.tries)
        return {**self.extras, "tries": self.tries} if failed else dict(self.extras)


async def score(
    reward_fn: RewardFn,
    task: dict[str, Any],
    trajectory: Trajectory,
    limit_s: float,
    retries: int = 0,
    policy: RetryPolicy = REWARD_TRIES,
    environment: RolloutEnvironment | None = None,
    grace_s: float = CANCEL_GRACE_S,
) -> Scored:
    """The reward of ``trajectory``: each try has ``limit_s`` seconds, and one that raised or
    timed out goes again up to ``retries`` times, after ``policy``'s backoff. A function that
    uses the environment gets ``environment`` (the same one on every try). A try that timed out
    is cancelled and given ``grace_s`` to end; one that ignores it is abandoned (see
    ``_timed_try``)."""
    scored = Scored()
    tries = dataclasses.replace(policy, attempts=retries + 1).retrying()
    try:
        async for attempt in tries:
            with attempt:
                scored.reward, scored.extras = await _timed_try(
                    reward_fn, task, trajectory, (limit_s, grace_s), scored.tries, environment
                )
    except RewardError as exc:
        scored.error = str(exc) if len(scored.tries) < 2 else f"{exc} ({len(scored.tries)} tries)"
    return scored


async def _timed_try(
    reward_fn: RewardFn,
    task: dict[str, Any],
    trajectory: Trajectory,
    limits: tuple[float, float],
    tries: list[dict[str, Any]],
    environment: RolloutEnvironment | None,
) -> tuple[float, dict[str, Any]]:
    """One try, noted in ``tries`` (its error and how long it took). Its time is bounded
    whatever the function does: past ``limit_s`` it is cancelled (a sync one's thread is left
    behind: it cannot be stopped), and a coroutine that swallows the cancel for ``grace_s`` is
    abandoned, still running, as an agent that does is (not ``wait_for``: that would wait
    for it for ever)."""
    limit_s, grace_s = limits
    start = time.monotonic()
    note: dict[str, Any] = {}
    tries.append(note)
    # Its own task: a function that cancels the task it runs in ends that one, a failed try.
    scorer = asyncio.ensure_future(call(reward_fn, task, trajectory, environment))
    try:
        await asyncio.wait({scorer}, timeout=limit_s)
        if not scorer.done():
            scorer.cancel()
            await asyncio.wait({scorer}, timeout=grace_s)
            if environment is not None:
                environment.end_abandoned()  # a sync try's thread goes on; its command must not
            note["error"] = f"reward function timed out after {limit_s:g} s"
            if not scorer.done():
                note["error"] += "; " + _IGNORED.format(grace=grace_s)
                _abandon(reward_fn, scorer, grace_s)
            raise _TryFailed(note["error"])
        if scorer.cancelled():
            note["error"] = "reward function cancelled its own task (asyncio.CancelledError)"
            raise _TryFailed(note["error"])
        return as_reward(scorer.result())
    except RewardError as exc:
        note.setdefault("error", str(exc))
        raise
    finally:
        if not scorer.done():  # the rollout is cancelled mid-score: the try goes with it
            scorer.cancel()
            _hold(scorer)
        note["elapsed_s"] = round(time.monotonic() - start, 6)


_IGNORED = (
    "it ignored its cancellation for {grace:g} s (it caught CancelledError and went on) and "
    "was abandoned, still running"
)


def _abandon(reward_fn: RewardFn, scorer: asyncio.Task[Any], grace_s: float) -> None:
    _hold(scorer)
    log.warning(
        "reward function %s ignored its cancellation for %g s and is abandoned, still running "
        "(its rollout is recorded; catch CancelledError only to clean up, then re-raise)",
        reward_identity(reward_fn),
        grace_s,
    )


def _hold(task: asyncio.Task[Any]) -> None:
    """Keep an abandoned ``task`` referenced until it ends, if it ever does."""
    _ABANDONED.add(task)
    task.add_done_callback(_ABANDONED.discard)


async def call(
    reward_fn: RewardFn,
    task: dict[str, Any],
    trajectory: Trajectory,
    environment: RolloutEnvironment | None = None,
) -> Any:
    """What the function (sync or async) returns: called with ``(task, trajectory)``, and
    ``environment`` third when it uses the environment (``@uses_environment``). What it raises,
    ``sys.exit()`` included, becomes a ``RewardError`` here, inside the task the try runs
    this in: a ``SystemExit`` that left a task would stop the event loop of every rollout."""
    args: tuple[Any, ...] = (task, trajectory)
    if needs_environment(reward_fn):
        if environment is None:
            raise RewardError(NO_ENVIRONMENT.format(name=reward_identity(reward_fn)))
        args = (task, trajectory, environment)
    try:
        if inspect.iscoroutinefunction(reward_fn) or _is_async_callable(reward_fn):
            return await _in_this_process(reward_fn(*args))
        # A sync scorer runs on a reward thread; on timeout it is abandoned, not killed.
        return await REWARD_THREADS.run(_on_worker, reward_fn, *args)
    except RewardError:
        raise
    except BaseException as exc:
        if not is_failure(exc):
            raise
        raise _TryFailed(f"reward function raised {type(exc).__name__}: {exc}") from exc


async def _in_this_process(scoring: Awaitable[Any]) -> Any:
    """``scoring``'s value; a child it forked that comes back here (a copy of the client, its
    event loop included) ends at once instead of running the batch on as a second client."""
    pid = os.getpid()
    try:
        return await scoring
    finally:
        if os.getpid() != pid:
            os._exit(0)


def _is_async_callable(fn: Any) -> bool:
    """An object whose ``__call__`` is a coroutine function (a ``Rubric``, say)."""
    return inspect.iscoroutinefunction(type(fn).__call__)


def _on_worker(reward_fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return reward_fn(*args)
    except KeyboardInterrupt as exc:  # no Ctrl-C lands on a worker thread: the scorer's own
        raise _TryFailed(f"reward function raised KeyboardInterrupt: {exc}") from exc


def as_reward(value: Any) -> tuple[float, dict[str, Any]]:
    """A reward function's value as its reward and extras; ``RewardError`` when it is none.
    The reward and each number among the extras (its components) must be finite floats: a
    NaN, an infinity or an int no float holds would poison every mean and advantage of its
    group, or stop the export that reads it."""
    if isinstance(value, dict):
        extras = {k: v for k, v in value.items() if k != "reward"}
        if not is_number(value.get("reward")):
            raise RewardError("a reward dict needs a numeric 'reward' key")
        for name, extra in extras.items():
            if is_number(extra) and finite_float(extra) is None:
                raise RewardError(
                    f"reward function returned {shown_number(extra)} for component {name!r}; "
                    "a component must be a finite number a float holds"
                )
        return _finite(value["reward"]), extras
    if is_number(value):
        return _finite(value), {}
    raise RewardError(f"reward function returned {type(value).__name__}, not float or dict")


def _finite(value: float) -> float:
    number = finite_float(value)
    if number is None:
        raise RewardError(
            f"reward function returned {shown_number(value)}; a reward must be a finite "
            "number a float holds"
        )
    return number
