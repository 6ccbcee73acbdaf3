"""Run a reward function (sync or async) with its own timeout, so one slow scorer never
stalls the batch. A function returns a float, or a dict with a float ``reward`` and extras."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from typing import Any

from rollway.errors import RewardError, is_failure
from rollway.trajectory import Trajectory

RewardFn = Callable[[dict[str, Any], Trajectory], Any]


async def score(
    reward_fn: RewardFn, task: dict[str, Any], trajectory: Trajectory, limit_s: float
) -> tuple[float, dict[str, Any]]:
    """The reward and its extra fields; ``RewardError`` on failure, bad value or timeout."""
    try:
        value = await asyncio.wait_for(_call(reward_fn, task, trajectory), limit_s)
    except TimeoutError:
        raise RewardError(f"reward function timed out after {limit_s:g} s") from None
    return _as_reward(value)


async def _call(reward_fn: RewardFn, task: dict[str, Any], trajectory: Trajectory) -> Any:
    """What the function returns. What it raises, ``sys.exit()`` included, becomes a
    ``RewardError`` here, inside the task ``wait_for`` runs this in: a ``SystemExit`` that
    left a task would stop the event loop of every rollout."""
    try:
        if inspect.iscoroutinefunction(reward_fn):
            return await reward_fn(task, trajectory)
        # A sync scorer runs on a worker thread; on timeout it is abandoned, not killed.
        return await asyncio.to_thread(_on_worker, reward_fn, task, trajectory)
    except RewardError:
        raise
    except BaseException as exc:
        if not is_failure(exc):
            raise
        raise RewardError(f"reward function raised {type(exc).__name__}: {exc}") from exc


def _on_worker(reward_fn: RewardFn, task: dict[str, Any], trajectory: Trajectory) -> Any:
    try:
        return reward_fn(task, trajectory)
    except KeyboardInterrupt as exc:  # no Ctrl-C lands on a worker thread: the scorer's own
        raise RewardError(f"reward function raised KeyboardInterrupt: {exc}") from exc


def _as_reward(value: Any) -> tuple[float, dict[str, Any]]:
    if isinstance(value, dict):
        extras = {k: v for k, v in value.items() if k != "reward"}
        if not isinstance(value.get("reward"), int | float) or isinstance(value["reward"], bool):
            raise RewardError("a reward dict needs a numeric 'reward' key")
        return _finite(value["reward"]), extras
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _finite(value), {}
    raise RewardError(f"reward function returned {type(value).__name__}, not float or dict")


def _finite(value: float) -> float:
    """A NaN or infinite reward would poison every mean and advantage of its group."""
    if not math.isfinite(value):
        raise RewardError(f"reward function returned {value}; a reward must be a finite number")
    return float(value)
