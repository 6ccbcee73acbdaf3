"""Run one agent on one rollout under a timeout and a cancel signal, and say how it ended.

Shared by the client (in-process agents) and the agent server (agents served over HTTP), so
both classify outcomes the same way."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.checks import finite_float, shown_number
from rollway.errors import AgentError, ErrorKind, error_kind, is_failure
from rollway.results import AgentResult, Status

log = logging.getLogger(__name__)

#: Agent tasks that ignored their cancel: held here (a task nothing references may be
#: collected mid-run) until they end, if they ever do.
_ABANDONED: set[asyncio.Task[Any]] = set()


@dataclass
class AgentOutcome:
    status: Status
    kind: ErrorKind | None = None
    reason: str | None = None
    result: AgentResult | None = None


async def run_agent(
    agent: AgentLoop,
    ctx: RolloutContext,
    *,
    cancel: asyncio.Event,
    timeout_s: float | None,
    stop_grace_s: float,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> AgentOutcome:
    """Run ``agent`` until it returns, ``timeout_s`` passes or ``cancel`` is set. A stopped agent
    gets ``on_stop`` (abort its generation), then ``agent.stop(ctx)`` and its return share
    ``stop_grace_s``; then its task is cancelled and gets ``stop_grace_s`` more to end. A task
    that ignores its cancel is abandoned (a coroutine cannot be killed): the outcome is
    recorded regardless. Failed stop steps go to ``ctx.cleanup_errors``.
    ``ctx.metrics.total_latency_ms`` gets the run's wall time, stop included."""
    started = time.perf_counter()
    agent_task = asyncio.create_task(_run(agent, ctx), name=ctx.rollout_id)
    cancel_wait = asyncio.create_task(cancel.wait())
    abandoned = False
    try:
        done, _ = await asyncio.wait(
            {agent_task, cancel_wait}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        cancel_wait.cancel()
        abandoned = await _stop(agent, ctx, agent_task, stop_grace_s, on_stop)
        # Read after the run: an agent may replace ctx.metrics (a remote one, with its report's).
        ctx.metrics.total_latency_ms = (time.perf_counter() - started) * 1000.0
    if agent_task not in done:
        ignored = f"; {_IGNORED.format(grace=stop_grace_s)}" if abandoned else ""
        if cancel.is_set():
            return AgentOutcome("cancelled", reason=f"cancelled by the caller{ignored}")
        return AgentOutcome("timeout", reason=f"timed out after {timeout_s:g} s{ignored}")
    if agent_task.cancelled():
        # Done before any stop here, so nothing of rollway's cancelled it: the agent's own code
        # did (``asyncio.current_task().cancel()``, say). Its failure, not a cancel to run again.
        reason = "the agent cancelled its own task (asyncio.CancelledError that nothing cancelled)"
        return AgentOutcome("error", "agent", reason)
    exc = agent_task.exception()
    if exc is not None:
        return AgentOutcome("error", error_kind(exc), f"{type(exc).__name__}: {exc}")
    result = agent_task.result()
    if not isinstance(result, AgentResult):
        reason = f"run returned {type(result).__name__}; return ctx.complete(...) or ctx.error(...)"
        return AgentOutcome("error", "agent", reason)
    problem = result_problem(result)
    if problem is not None:
        return AgentOutcome("error", "agent", f"run returned an invalid result: {problem}")
    if result.error is not None:
        return AgentOutcome("error", "agent", result.error, result)
    return AgentOutcome("completed", result=result)


async def _run(agent: AgentLoop, ctx: RolloutContext) -> Any:
    """``agent.run``, whose ``sys.exit()`` becomes an ``AgentError``: a ``SystemExit`` that
    left its task would stop the event loop of every rollout."""
    try:
        return await agent.run(ctx)
    except Exception:
        raise
    except BaseException as exc:
        if not is_failure(exc):
            raise
        raise AgentError(f"run raised {type(exc).__name__}: {exc}") from exc


def result_problem(result: AgentResult) -> str | None:
    """What is wrong with an agent's result, if anything: it becomes the rollout's record, so
    a wrong type there would lose the rollout instead of recording the agent's mistake."""
    # Read as objects: the agent's code made the result, and nothing enforced its annotations.
    messages: object = result.messages
    finish_reason: object = result.finish_reason
    reward: object = result.reward
    error: object = result.error
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return "messages must be a list of message dicts"
    if not isinstance(finish_reason, str):
        return f"finish_reason must be a string, not {type(finish_reason).__name__}"
    if reward is not None and finite_float(reward) is None:
        return f"reward must be a finite number or None, not {shown_number(reward)}"
    if error is not None and not isinstance(error, str):
        return f"error must be a string, not {type(error).__name__}"
    return None


_IGNORED = (
    "the agent ignored its cancellation for {grace:g} s (it caught CancelledError and went "
    "on): its task was abandoned, still running"
)


async def _stop(
    agent: AgentLoop,
    ctx: RolloutContext,
    agent_task: asyncio.Task[Any],
    grace_s: float,
    on_stop: Callable[[], Awaitable[None]] | None,
) -> bool:
    """Stop ``agent_task`` (see ``run_agent``); True when it ignored its cancel and was
    abandoned."""
    if agent_task.done():
        return False
    loop = asyncio.get_running_loop()
    # A step that fails (the gateway or agent server is gone) is recorded, and the agent is
    # still stopped: nothing here may leave the rollout waiting or replace the outcome.
    if on_stop is not None:
        try:
            await on_stop()
        except Exception as exc:
            ctx.cleanup_failed("abort", exc)
    deadline = loop.time() + grace_s
    try:
        await _call_stop(agent, ctx, grace_s)
        await asyncio.wait({agent_task}, timeout=max(0.0, deadline - loop.time()))
        if agent_task.done():
            return False
        agent_task.cancel()
        await asyncio.wait({agent_task}, timeout=grace_s)
    finally:
        agent_task.cancel()  # every path: a rollout cancelled mid-stop takes its agent along
    if agent_task.done():
        return False
    _hold(agent_task)
    log.warning(
        "agent task %s ignored its cancellation for %g s and is abandoned, still running "
        "(its rollout is recorded; catch CancelledError only to clean up, then re-raise)",
        agent_task.get_name(),
        grace_s,
    )
    return True


async def _call_stop(agent: AgentLoop, ctx: RolloutContext, grace_s: float) -> None:
    """``agent.stop(ctx)`` in its own task, for ``grace_s`` at most: one that hangs, or that
    cancels its own task, is the stop step's failure, not the rollout's end."""
    stopping = asyncio.create_task(_stopped(agent, ctx))
    try:
        await asyncio.wait({stopping}, timeout=grace_s)
    finally:
        if not stopping.done():
            stopping.cancel()  # not awaited: one that ignores it must not hold the rollout
            _hold(stopping)
    if not stopping.done():
        ctx.cleanup_failed("stop", TimeoutError(f"stop() did not return within {grace_s:g} s"))
    elif stopping.cancelled():
        ctx.cleanup_failed("stop", asyncio.CancelledError("stop() cancelled its own task"))
    elif (error := stopping.result()) is not None:
        ctx.cleanup_failed("stop", error)


async def _stopped(agent: AgentLoop, ctx: RolloutContext) -> BaseException | None:
    """``agent.stop``, and what it raised: returned, as a ``sys.exit()`` that left its task
    would stop the event loop of every rollout (as in ``_run``)."""
    try:
        await agent.stop(ctx)
    except BaseException as exc:  # the agent's own code: its sys.exit() too
        if not is_failure(exc):
            raise
        return exc
    return None


def _hold(task: asyncio.Task[Any]) -> None:
    """Keep an abandoned ``task`` referenced until it ends, if it ever does."""
    _ABANDONED.add(task)
    task.add_done_callback(_ABANDONED.discard)
