"""One rollout from start to its one recorded outcome: register, run the agent under a timeout
and a cancel signal, clean up on every path, score, retry infrastructure failures, store, and
only then unregister."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

from rollway import tracing
from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.agents.execution import AgentOutcome, run_agent
from rollway.errors import (
    RolloutClosedError,
    UnknownRolloutError,
    error_kind,
)
from rollway.events import EventBus, RolloutStarted
from rollway.gateway.chat_answer import Registration
from rollway.gateway.handle import GatewayHandle
from rollway.gateway.request_schema import RegisterRequest
from rollway.logs import log_stage
from rollway.loop_thread import in_thread
from rollway.results import AgentResult, RolloutMetrics, RolloutRecord
from rollway.rollouts.availability import Availability, Outage, OutageWaits
from rollway.rollouts.config import RolloutConfig
from rollway.rollouts.judge import judging
from rollway.rollouts.records import make_record
from rollway.rollouts.rewards import RewardFn, score
from rollway.rollouts.rollout_span import end_span, span_attributes
from rollway.rollouts.spec import RolloutSpec, attempt_id
from rollway.rollouts.task_scorers import task_scorer
from rollway.rollouts.time_spent import where_time_went
from rollway.sandbox.environment import RolloutEnvironment, needs_environment
from rollway.store.base import Store
from rollway.trajectory import Trajectory

log = logging.getLogger(__name__)


class RunningAttempts:
    """The attempts running now, by gateway id: one can be stopped from outside (the client's
    stuck-rollout watchdog) with the reason its record gives. Shared by a client's runners."""

    def __init__(self) -> None:
        self._cancels: dict[str, asyncio.Event] = {}
        self._reasons: dict[str, str] = {}

    def abort(self, rollout_id: str, reason: str) -> bool:
        """Stop the attempt, to be recorded as a ``timeout`` with ``reason``; False when it
        is not running (or already stopping)."""
        cancel = self._cancels.get(rollout_id)
        if cancel is None or cancel.is_set():
            return False
        self._reasons[rollout_id] = reason
        cancel.set()  # the rollout's own signal: no retry follows
        return True

    @contextlib.contextmanager
    def running(self, rollout_id: str, cancel: asyncio.Event) -> Iterator[None]:
        self._cancels[rollout_id] = cancel
        try:
            yield
        finally:
            self._cancels.pop(rollout_id, None)

    def aborted(self, rollout_id: str) -> str | None:
        return self._reasons.pop(rollout_id, None)


class RolloutRunner:
    def __init__(
        self,
        agent: AgentLoop,
        gateway: GatewayHandle,
        store: Store,
        settings: RolloutConfig,
        reward_fn: RewardFn | None = None,
        events: EventBus | None = None,
        attempts: RunningAttempts | None = None,
        availability: Availability | None = None,
    ) -> None:
        self.agent, self.gateway, self.store = agent, gateway, store
        self.settings, self.reward_fn = settings, reward_fn
        # Each attempt's start goes here; its turns come from the gateway's own bus, and its
        # outcome from the client, which has the final record.
        self.events = events if events is not None else EventBus()
        self.attempts = attempts if attempts is not None else RunningAttempts()
        #: The components rollouts wait for while they are down (shared by a client's runners).
        self.availability = availability if availability is not None else Availability()

    async def run(self, spec: RolloutSpec, cancel: asyncio.Event) -> RolloutRecord:
        """Exactly one outcome for ``spec``, written to the store and returned."""
        started_at, clock = time.time(), time.monotonic()
        policy = self.settings.retry
        attempts = itertools.count(spec.first_attempt)
        # A worker that died may have left earlier attempts open on a shared gateway.
        opened = [attempt_id(self.settings, spec, n) for n in range(1, spec.first_attempt)]

        async def attempt() -> RolloutRecord:
            if cancel.is_set():  # while queued or waiting to retry: register and start nothing
                return _cancelled_unstarted(spec, self.settings, len(opened), started_at)
            number = next(attempts)
            rollout_id = attempt_id(self.settings, spec, number)
            opened.append(rollout_id)
            with tracing.span("rollway.rollout", span_attributes(spec, rollout_id, number)) as span:
                record = await self._attempt(spec, number, cancel, started_at)
                end_span(span, record)
            return record

        outages = OutageWaits(self.availability, self.settings.limits.timeout)
        lost: RolloutRecord | None = None  # the last attempt that failed

        async def attempt_through_outages() -> RolloutRecord:
            # A component that is down costs no try: the rollout waits for it (no attempt
            # starts meanwhile) and an attempt it ended goes again, uncounted.
            nonlocal lost
            while True:
                outage = await outages.wait(cancel)
                if outage is not None:
                    count = max(spec.first_attempt, len(opened))
                    return _outage_record(spec, self.settings, outage, lost, count, started_at)
                epoch = self.availability.epoch
                record = lost = await attempt()
                if not await outages.lost(record, epoch, cancel):
                    return record
                log_stage(log, "outage", record.rollout_id, reason=record.reason)

        retries = policy.retrying(give_up=lambda: cancel.is_set() or outages.ended)
        record: RolloutRecord = await retries(attempt_through_outages)
        record = record.model_copy(update={"elapsed_s": time.monotonic() - clock})
        await in_thread(self.store.write, record)
        # Only now: a client that dies before the write finds the rollout still on a shared
        # gateway when it restarts, and re-attaches instead of running it again.
        await self._unregister(opened)
        log_stage(
            log,
            "finish",
            record.rollout_id,
            status=record.status,
            attempts=record.attempts,
            reward=record.reward,
        )
        return record

    async def _unregister(self, rollout_ids: list[str]) -> None:
        for rollout_id in rollout_ids:
            try:
                await self.gateway.unregister(rollout_id)
            except UnknownRolloutError:
                pass  # registration itself failed
            except Exception as exc:
                log.warning(
                    "unregister failed: %r",
                    exc,
                    extra={"rollout_id": rollout_id, "stage": "unregister"},
                )

    async def _attempt(
        self, spec: RolloutSpec, attempt: int, cancel: asyncio.Event, started_at: float
    ) -> RolloutRecord:
        rollout_id = attempt_id(self.settings, spec, attempt)
        if self.events:
            self.events(
                RolloutStarted(
                    rollout_id=rollout_id,
                    task_key=spec.rollout_key,
                    group=spec.group_id,
                    attempt=attempt,
                )
            )
        register = self._registration(spec)
        ctx: RolloutContext | None = None
        result: AgentResult | None = None
        trajectory: Trajectory | None = None
        cleanup_errors: list[str] = []
        try:
            registration = await self._register(rollout_id, register)
            log_stage(log, "register", rollout_id)
        except Exception as exc:
            outcome = AgentOutcome("error", "infrastructure", f"register failed: {exc}")
        else:
            ctx, outcome, waited = await self._run_agent(
                spec, rollout_id, registration.api_key, cancel
            )
            # What the agent returned is recorded even if the outcome is reclassified below.
            result = outcome.result
            trajectory, cleanup_errors = await self._clean_up(rollout_id)
            if ctx is not None:
                cleanup_errors = [*ctx.cleanup_errors, *cleanup_errors]
            outcome = _as_recorded(outcome, trajectory, cleanup_errors)
            outcome = _with_time_spent(outcome, trajectory, waited)
        try:
            environment = ctx.environment if ctx is not None else None
            outcome, reward, reward_info = await self._scored(
                spec, outcome, trajectory, environment
            )
        finally:
            if ctx is not None and ctx.environment is not None:
                cleanup_errors = [*cleanup_errors, *await _tear_down(ctx.environment)]
        return make_record(
            spec,
            self.settings,
            outcome.status,
            outcome.kind,
            outcome.reason,
            attempts=attempt,
            started_at=started_at,
            reward=reward,
            reward_info=reward_info,
            metrics=ctx.metrics if ctx is not None else RolloutMetrics(),
            messages=result.messages if result is not None else [],
            finish_reason=result.finish_reason if result is not None else None,
            cleanup_errors=cleanup_errors,
            trajectory=trajectory,
        )

    async def _run_agent(
        self, spec: RolloutSpec, rollout_id: str, api_key: str, cancel: asyncio.Event
    ) -> tuple[RolloutContext | None, AgentOutcome, str | None]:
        """The agent's run of a registered attempt, under its timeout and cancel signal; the
        context is None when it could not be made. Last: where the rollout waited when its
        time ran out (None: it did not, or this process cannot see its gateway)."""
        ctx: RolloutContext | None = None
        waited: list[str | None] = []

        async def stop() -> None:
            waited.append(where_time_went(self.gateway, rollout_id))  # before the abort
            await self.gateway.cancel(rollout_id)

        try:
            ctx = self._context(spec, rollout_id, api_key)
            with self.attempts.running(rollout_id, cancel):
                outcome = await run_agent(
                    self.agent,
                    ctx,
                    cancel=cancel,
                    timeout_s=self.settings.limits.timeout,
                    stop_grace_s=self.settings.limits.stop_grace_s,
                    on_stop=stop,
                )
        except Exception as exc:  # get_tools failed, say
            outcome = AgentOutcome("error", error_kind(exc), f"{type(exc).__name__}: {exc}")
        stuck = self.attempts.aborted(rollout_id)
        if stuck is not None and outcome.status == "cancelled":
            # The watchdog's reason says where it waited already.
            return ctx, AgentOutcome("timeout", reason=stuck, result=outcome.result), None
        return ctx, outcome, waited[0] if waited and outcome.status == "timeout" else None

    async def _scored(
        self,
        spec: RolloutSpec,
        outcome: AgentOutcome,
        trajectory: Trajectory | None,
        environment: RolloutEnvironment | None,
    ) -> tuple[AgentOutcome, float | None, dict[str, Any]]:
        """The outcome of a completed attempt with its reward (truncated when its trajectory
        is: a gateway limit ended it or its last turn was cut; an error when the reward
        failed after its retries, its tries in the reward info); any other outcome unscored."""
        if outcome.status != "completed" or trajectory is None:
            return outcome, None, {}
        if trajectory.is_truncated:
            outcome.status = "truncated"
        reward, reward_info, error = await self._reward(
            spec, outcome.result, trajectory, environment
        )
        if error is not None:  # the trajectory stays in the record: ``rollway rescore``
            return AgentOutcome("error", "reward", error), None, reward_info
        return outcome, reward, reward_info

    async def _register(self, rollout_id: str, params: RegisterRequest) -> Registration:
        # Agents that can re-attach (served ones) pick up a rollout a dead client left open
        # on a shared gateway; for the rest it is stale (its agent died with the client).
        reuse = self.agent.reattaches
        try:
            return await self.gateway.register(rollout_id, params, reuse=reuse)
        except RolloutClosedError:
            await self.gateway.unregister(rollout_id)
            return await self.gateway.register(rollout_id, params)

    def _registration(self, spec: RolloutSpec) -> RegisterRequest:
        """The client's fixed sampling and limits, and the task's metadata. Each rollout gets
        its own seed derived from the run's, so a group's samples differ and a rerun of the
        same rollout draws the same tokens."""
        settings, sampling = self.settings, self.settings.sampling
        if sampling.seed is not None:
            sampling = sampling.replace(seed=spec.seed(sampling.seed))
        return RegisterRequest(
            **settings.fixed_sampling(sampling),
            max_turns=settings.limits.max_turns,
            max_seq_len=settings.limits.max_seq_len,
            metadata={
                **{k: v for k, v in spec.task.items() if k not in ("messages", "prompt")},
                "group_id": spec.group_id,
                "group_index": spec.group_index,
                "sample_index": spec.sample_index,
            },
        )

    def _context(self, spec: RolloutSpec, rollout_id: str, api_key: str) -> RolloutContext:
        debug_dir = self.store.debug_dir
        debug_path = None
        if debug_dir is not None and self.settings.debug:
            debug_dir.mkdir(parents=True, exist_ok=True)
            debug_path = debug_dir / f"{rollout_id}.jsonl"
        tools = self.agent.get_tools(spec.task)
        return RolloutContext(
            spec.task,
            tools,
            rollout_id,
            self.gateway,
            debug_path,
            base_url=self.gateway.base_url(rollout_id),
            api_key=api_key,
            gateway_socket=self.gateway.socket_path,
            settings=self.settings,
            events=self.events,
            # The reward runs in the agent's sandbox: it is lent, not torn down, at the end.
            keep_environment=needs_environment(self.reward_fn),
        )

    async def _clean_up(self, rollout_id: str) -> tuple[Trajectory | None, list[str]]:
        """Abort in-flight generation and fetch the trajectory; errors are recorded (the last
        one says why there is no trajectory, when there is none)."""
        errors: list[str] = []
        try:
            await self.gateway.cancel(rollout_id)
        except Exception as exc:
            errors.append(_cleanup_error("cancel", rollout_id, exc))
        try:
            trajectory = await self.gateway.trajectory(rollout_id)
        except Exception as exc:
            errors.append(_cleanup_error("fetch_trajectory", rollout_id, exc))
            return None, errors
        log_stage(log, "fetch_trajectory", rollout_id, turns=len(trajectory.turns))
        return trajectory, errors

    async def _reward(
        self,
        spec: RolloutSpec,
        result: AgentResult | None,
        trajectory: Trajectory,
        environment: RolloutEnvironment | None,
    ) -> tuple[float | None, dict[str, Any], str | None]:
        """The reward function's score when the client was given one (it was asked for
        explicitly: ``--reward``, ``reward=``), with the agent's own reward, if it set one, kept
        beside it as ``agent_reward``; else the agent's own. Last: why the function gave no
        reward (None: it did). Without a reward function, a task that names its own scorer
        (``rollouts.task_scorers``: reasoning-gym's rows) is scored by it."""
        agent_reward = None if result is None or result.reward is None else float(result.reward)
        reward_fn = self.reward_fn if self.reward_fn is not None else task_scorer(spec.task)
        if reward_fn is None:
            return agent_reward, {} if agent_reward is None else {"source": "agent"}, None
        limits = self.settings.limits
        # A judge among the reward's functions asks the policy's engine through this gateway,
        # as rollouts of its own: its calls are noted here, apart from the trajectory.
        with judging(self.gateway, trajectory.rollout_id) as judge_calls:
            scored = await score(
                reward_fn,
                spec.task,
                trajectory,
                limits.reward_timeout,
                limits.reward_retries,
                environment=environment,
                grace_s=limits.stop_grace_s,
            )
        source = "reward_fn" if self.reward_fn is not None else "task_scorer"
        info: dict[str, Any] = {**scored.info(), "source": source}
        if judge_calls:
            info["judge_calls"] = judge_calls
        if agent_reward is not None:
            info["agent_reward"] = agent_reward
        return scored.reward, info, scored.error


async def _tear_down(environment: RolloutEnvironment) -> list[str]:
    """The environment lent to the reward, torn down once the rollout is scored (on every
    path); what failed, as cleanup errors."""
    try:
        await environment.close()
    except Exception as exc:
        return [f"teardown: {type(exc).__name__}: {exc}"]
    return []


def _cleanup_error(stage: str, rollout_id: str, exc: Exception) -> str:
    log_stage(log, stage, rollout_id, level=logging.WARNING, error=repr(exc))
    return f"{stage}: {type(exc).__name__}: {exc}"


def _cancelled_unstarted(
    spec: RolloutSpec, settings: RolloutConfig, opened: int, started_at: float
) -> RolloutRecord:
    """The record of a rollout cancelled while queued or waiting to retry (``opened``
    attempts so far, counting those a dead worker left)."""
    why = "while waiting to retry" if opened >= spec.first_attempt else "before it started"
    attempts = max(spec.first_attempt, opened)
    return make_record(
        spec,
        settings,
        "cancelled",
        None,
        f"cancelled {why}",
        attempts=attempts,
        started_at=started_at,
    )


def _outage_record(
    spec: RolloutSpec,
    settings: RolloutConfig,
    outage: Outage,
    lost: RolloutRecord | None,
    attempts: int,
    started_at: float,
) -> RolloutRecord:
    """The record of a rollout whose wait for a component ran out: the attempt the outage
    ended, if one did, now blamed on the component."""
    kind, reason = outage.component.kind, outage.reason()
    if lost is None:
        return make_record(
            spec,
            settings,
            "error",
            kind,
            f"{reason}; no attempt had started",
            attempts=attempts,
            started_at=started_at,
        )
    update = {
        "status": "error",  # a timeout it caused included: the component's fault, rerun
        "error_kind": kind,
        "reason": f"{reason}; its last attempt ended: {lost.reason}",
    }
    return lost.model_copy(update=update)


def _as_recorded(
    outcome: AgentOutcome, trajectory: Trajectory | None, cleanup_errors: list[str]
) -> AgentOutcome:
    """The agent's outcome, reclassified by what the gateway recorded (or failed to)."""
    if trajectory is None:
        if outcome.status == "cancelled":
            return outcome
        return _unrecorded(outcome, cleanup_errors[-1])
    if trajectory.is_cancelled and outcome.status in ("error", "completed"):
        return _cancelled_at_gateway(outcome)
    if outcome.kind == "agent" and trajectory.engine_errors:
        # A program agent exits on the gateway's 502: the engine failed, not the agent.
        reason = f"the engine failed ({trajectory.engine_errors[-1]}); the agent said "
        return AgentOutcome("error", "engine", reason + str(outcome.reason))
    refusals = trajectory.refusals
    if outcome.status == "error" and outcome.kind == "agent" and refusals is not None:
        # A program that exits on the gateway's 4xx says little of it: the refusal says why.
        first = refusals.first_body.get("error", {}).get("message")
        said = f"the gateway refused {refusals.count} request(s), first {refusals.first_status}"
        outcome.reason = f"{outcome.reason}; {said}: {first}"
    return outcome


def _with_time_spent(
    outcome: AgentOutcome, trajectory: Trajectory | None, waited: str | None
) -> AgentOutcome:
    """A timeout's outcome that says how many turns finished (a turn its abort cut short does
    not count) and where the rollout was waiting when its time ran out (``waited``: the
    engine, the gateway or its agent; None where that is not known here, or the watchdog's
    reason says it already), so a timeout with no turn is never a bare one."""
    if outcome.status != "timeout" or trajectory is None or waited is None:
        return outcome
    finished = sum(turn.finish_reason != "abort" for turn in trajectory.turns)
    said = "no turn finished" if not finished else f"{finished} turn(s) finished"
    # After the first clause ("timed out after N s"), before what followed it (the agent
    # ignored its cancellation, say).
    head, sep, rest = (outcome.reason or "").partition("; ")
    outcome.reason = f"{head} ({said}); {waited}{sep}{rest}"
    return outcome


def _cancelled_at_gateway(outcome: AgentOutcome) -> AgentOutcome:
    """The outcome of an attempt that a cancel made at the gateway cut short (its admin
    route: an operator, a script): cancelled, whoever cancelled, so resume runs it again.
    What the agent made of its refused call says nothing about the policy."""
    said = outcome.status + (f": {outcome.reason}" if outcome.reason else "")
    reason = f"cancelled at the gateway; the agent said {said}"
    return AgentOutcome("cancelled", reason=reason, result=outcome.result)


def _unrecorded(outcome: AgentOutcome, fetch_error: str) -> AgentOutcome:
    """The outcome of an attempt whose trajectory could not be fetched: the gateway died, or
    restarted and forgot the rollout (then the agent's own calls failed too, so its outcome
    says nothing about the policy). Without its recording the attempt is worth nothing to a
    trainer, so it is an infrastructure error: retried, and rerun by resume."""
    said = outcome.status + (f": {outcome.reason}" if outcome.reason else "")
    reason = f"the gateway lost the rollout's recording ({fetch_error}); the agent said {said}"
    return AgentOutcome("error", "infrastructure", reason)
