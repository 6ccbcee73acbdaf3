"""A trainer's step source: ``client.step_source(tasks, group_size=G, groups_per_step=B)``
hands the trainer, once per step, B whole groups as soon as B are done.

Groups finish out of order: up to ``B * (1 + over_sample)`` are kept going (in flight or ready),
and what still runs when a batch is handed over goes on and counts towards the next step
(never cancelled). A flat group (every reward the same: no advantage) is set aside and a new task
takes its place (dynamic sampling), at most ``max_extra_groups`` a step; past that the batch is
handed over as soon as B cannot be reached, saying how many groups it lacks (none at all, at the
start of training, say: an empty batch, and the next step goes on). A sample lost to
the infrastructure (an engine, gateway, agent server or sandbox failure, or a cancel by someone
else) is never handed over: the same task runs again in its group (the group waits), at most
``max_refills`` times a sample, each reason recorded; so is one without a reward of its own
(``unscored``, ``step_groups.Unscored``). A rollout more than ``max_staleness``
versions behind the trainer's weights when its group is ready follows ``stale``
(``step_groups.StalePolicy``). Which tasks are settled (set aside, or in a batch the trainer is
done with: ``StepBatch.done``) is written to the store by task identity (``steps.json``): a
restarted trainer's source goes on from there, and hands again a batch it was not done with.

Completions are handled on the client's loop thread (future callbacks); the trainer's thread
waits on a condition. All state is under one lock."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rollway.client.future import RolloutFuture
from rollway.client.policy_tracker import PolicyTracker
from rollway.client.step_groups import (
    Group,
    Slot,
    StepBatch,
    StepMetrics,
    behind,
    needs_refill,
    sets_aside,
    token_staleness,
)
from rollway.client.step_plan import StepPlan
from rollway.client.task_stream import Settled, TaskStream
from rollway.events import EventSink, StepHandedOver
from rollway.rollouts import RolloutConfig, RolloutSpec, task_key
from rollway.store.base import Store

log = logging.getLogger(__name__)

#: The store summary that holds the source's position.
POSITION = "steps"


@dataclass(frozen=True)
class StepHooks:
    """The parts of the client a step source uses."""

    exp_id: str
    store: Store
    policy: PolicyTracker
    submit: Callable[[RolloutSpec, RolloutConfig], RolloutFuture]
    fingerprint: Callable[[RolloutConfig], dict[str, Any]]
    #: Holds the experiment's lease while the source is open.
    lease: Callable[[], AbstractContextManager[None]]
    events: EventSink
    status_interval: float


class StepSource:
    """Iterate it (``for batch in source``, ``async for``) or call ``next_batch()`` once per
    step; each gives a ``StepBatch``. Close it (or ``with``) to cancel what still runs."""

    def __init__(self, hooks: StepHooks, plan: StepPlan, tasks: Iterable[dict[str, Any]],
                 *, epochs: int, resume: bool) -> None:  # fmt: skip
        self._hooks, self._plan = hooks, plan
        stored = _read_position(hooks.store) if resume else None
        where = _where(hooks.store)
        settled = Settled.from_dict(stored, where) if stored else Settled()
        self._stream = TaskStream(tasks, epochs, settled, where)
        self._step = int(stored.get("step", 0)) if stored else 0
        self._done_steps = self._step  # 1 + the last step the trainer was done with
        self._handed: dict[int, list[Group]] = {}  # by step: handed, the trainer not done
        self._run_id = uuid.uuid4().hex
        self._cond = threading.Condition(threading.RLock())
        self._owned: list[Group] = []
        self._ready: list[Group] = []
        self._metrics = StepMetrics()
        self._set_aside_now = 0  # groups set aside since the last hand-over
        self._asking = False
        self._closed = False
        self._lease: AbstractContextManager[None] | None = None
        self._drops: Counter[int] = Counter()  # groups dropped as stale, by position

    # -- the trainer's side -----------------------------------------------------------------

    def next_batch(self) -> StepBatch:
        """The next step's batch, once B groups are ready (``StopIteration`` once the tasks
        are done and every group was handed over or set aside)."""
        started = time.monotonic()
        if self._lease is None and not self._closed:
            self._lease = self._hooks.lease()
            self._lease.__enter__()
        with self._cond:
            self._done_with(list(self._handed))  # asking again: done with the last batch
            self._asking = True
            try:
                groups = self._wait_for_groups()
            finally:
                self._asking = False
            batch = self._hand_over(groups, time.monotonic() - started)
            self._top_up()  # with prefetch, the next step's groups start while this one trains
            self._write_position()  # the groups set aside meanwhile
        log.info(batch.metrics.line(), extra={"stage": "step"})
        self._hooks.events(StepHandedOver(step=batch.step, metrics=batch.metrics.to_dict()))
        return batch

    async def next_batch_async(self) -> StepBatch:
        """``next_batch`` without blocking the running loop (``StopAsyncIteration`` at the
        end)."""
        batch = await asyncio.to_thread(self._next_or_none)
        if batch is None:
            raise StopAsyncIteration
        return batch

    def _next_or_none(self) -> StepBatch | None:
        # A StopIteration cannot cross into a future.
        try:
            return self.next_batch()
        except StopIteration:
            return None

    def __iter__(self) -> Iterator[StepBatch]:
        return self

    def __next__(self) -> StepBatch:
        return self.next_batch()

    def __aiter__(self) -> AsyncIterator[StepBatch]:
        return self

    async def __anext__(self) -> StepBatch:
        return await self.next_batch_async()

    @property
    def plan(self) -> StepPlan:
        """Its settings (``group_size``, ``groups_per_step``, the sampling in ``settings``):
        what a trainer adapter checks its own batch shape and sampling against."""
        return self._plan

    @property
    def in_flight(self) -> int:
        """Groups running now (not yet ready)."""
        with self._cond:
            return len(self._owned) - len(self._ready)

    def close(self) -> None:
        """Cancel what still runs (those tasks are not settled: a restarted source runs them),
        settle the batch handed last (the trainer closed its source: it is done with it), write
        the position, give the experiment back."""
        self._close(done=True)

    def _close(self, done: bool) -> None:
        with self._cond:
            if self._closed:
                return
            if done:
                self._done_with(list(self._handed))
            self._closed = True
            futures = [s.future for g in self._owned for s in g.slots if s.future is not None]
            self._cond.notify_all()
        for future in futures:
            future.cancel()
        for future in futures:
            future._future.exception()  # wait: every rollout has its record
        if self._lease is not None:
            self._lease.__exit__(None, None, None)

    def __enter__(self) -> StepSource:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # An exception (the trainer failed mid-step): its last batch is not settled.
        self._close(done=exc_type is None)

    def _done_with(self, steps: list[int]) -> None:
        """Under the lock: the trainer is done with the batches of ``steps``: settle their
        tasks and say so in the store."""
        groups = [g for step in steps for g in self._handed.pop(step, [])]
        if not steps or self._closed:
            return
        for group in groups:
            self._stream.settled.add(group.identity)
        self._done_steps = max(self._done_steps, max(steps) + 1)
        self._write_position()

    def _write_position(self) -> None:
        position = {"step": self._done_steps, **self._stream.settled.to_dict()}
        self._hooks.store.write_summary(POSITION, position)

    # -- waiting for a step ------------------------------------------------------------------

    def _wait_for_groups(self) -> list[Group]:
        """Under the lock: B ready groups, fewer once B cannot be reached, or StopIteration."""
        need = self._plan.groups_per_step
        while True:
            if self._closed:
                raise StopIteration
            self._recheck_ready()
            self._top_up()
            if len(self._ready) >= need:
                return self._ready[:need]
            in_flight = len(self._owned) - len(self._ready)
            reachable = len(self._ready) + in_flight >= need
            if not reachable and not self._can_start() and (self._ready or in_flight == 0):
                if not self._ready and not self._stream.more:
                    raise StopIteration
                # Short, or even empty (every group flat): handed, and the next step goes on.
                return list(self._ready)
            if not self._cond.wait(self._hooks.status_interval):
                log.info(
                    "step %d: %d of %d groups ready, %d in flight",
                    self._step, len(self._ready), need, in_flight, extra={"stage": "step"},
                )  # fmt: skip

    def _can_start(self) -> bool:
        """Whether a new group may start for this step."""
        extra_left = self._set_aside_now <= self._plan.max_extra_groups
        return self._stream.more and extra_left

    def _top_up(self) -> None:
        """Start groups while fewer than the cap are going (between steps only with
        ``prefetch``: a synchronous trainer's weights should not lag new rollouts)."""
        if not (self._asking or self._plan.prefetch) or self._closed:
            return
        while len(self._owned) < self._plan.cap and self._can_start():
            drawn = self._stream.next()
            if drawn is None:
                return
            position, identity, task = drawn
            self._start_group(position, identity, task, instance=self._drops[position])

    def _hand_over(self, groups: list[Group], waited_s: float) -> StepBatch:
        version = self._hooks.policy.version
        for group in groups:
            self._ready.remove(group)
            self._owned.remove(group)
        self._handed[self._step] = groups  # settled once the trainer is done with them
        records = [group.records for group in groups]
        metrics = self._metrics
        metrics.step = self._step
        metrics.groups_used = len(groups)
        metrics.lacking = self._plan.groups_per_step - len(groups)
        metrics.carried_over = len(self._owned)
        metrics.staleness = dict(token_staleness([r for g in records for r in g], version))
        metrics.wait_s = waited_s
        self._metrics, self._set_aside_now = StepMetrics(), 0
        self._step += 1
        step = metrics.step

        def settle() -> None:
            with self._cond:
                self._done_with([step])

        return StepBatch(metrics.step, records, metrics.lacking, version, metrics, settle)

    # -- groups ------------------------------------------------------------------------------

    def _start_group(
        self, position: int, identity: tuple[str, int], task: dict[str, Any], instance: int
    ) -> None:
        key = f"{task_key(task)}-{position}" + (f"-d{instance}" if instance else "")
        group_id = f"{self._hooks.exp_id}:{key}"
        slots = [
            Slot(RolloutSpec(task, position, key, group_id, position, sample, run_id=self._run_id))
            for sample in range(self._plan.group_size)
        ]
        group = Group(position, identity, task, instance, slots)
        self._owned.append(group)
        for slot in slots:
            self._run(group, slot, first_attempt=1)

    def _run(self, group: Group, slot: Slot, first_attempt: int) -> None:
        """Start an attempt for ``slot`` (a refill or a restart: a later attempt number, so
        gateway ids stay unique; its record replaces the earlier one in the store)."""
        settings = self._plan.settings
        slot.spec = dataclasses.replace(
            slot.spec, first_attempt=first_attempt, fingerprint=self._hooks.fingerprint(settings)
        )
        slot.record = None
        future = self._hooks.submit(slot.spec, settings)
        slot.future = future
        future._future.add_done_callback(lambda _: self._finished(group, slot, future))

    def _finished(self, group: Group, slot: Slot, future: RolloutFuture) -> None:
        """A sample's attempt ended (on the client's loop thread)."""
        with self._cond:
            cf = future._future
            if self._closed or slot.future is not future or cf.cancelled() or cf.exception():
                return
            record = cf.result()
            why = needs_refill(record, self._plan.unscored)
            if why is not None and slot.refills < self._plan.max_refills:
                slot.refills += 1
                self._note_failure(group, slot, why, refilled=record.error_kind or record.status)
                self._run(group, slot, first_attempt=record.attempts + 1)
                return
            why = why or sets_aside(record, self._plan.unscored)
            if why is not None:
                group.failed = why
                self._note_failure(group, slot, why, refilled=None)
            slot.record = record
            if group.done:
                self._settle(group)
            self._top_up()
            self._cond.notify_all()

    def _note_failure(self, group: Group, slot: Slot, why: str, refilled: str | None) -> None:
        failure = {"group_id": slot.spec.group_id, "sample": slot.spec.sample_index, "reason": why}
        self._metrics.failures.append({**failure, "refilled": refilled is not None})
        if refilled is not None:
            self._metrics.refilled[refilled] = self._metrics.refilled.get(refilled, 0) + 1
            log.info("refilling %s sample %d: %s", slot.spec.group_id, slot.spec.sample_index,
                     why, extra={"stage": "step"})  # fmt: skip

    def _settle(self, group: Group) -> None:
        """A group with every sample recorded: set aside, handled for staleness, or ready."""
        if group.failed is not None:
            self._set_aside(group)
            self._metrics.set_aside_failed += 1
        elif self._stale_slots(group):
            self._handle_stale(group)
        elif self._plan.dynamic_sampling and group.flat:
            self._set_aside(group)
            self._metrics.set_aside_flat += 1
        else:
            self._ready.append(group)

    def _set_aside(self, group: Group) -> None:
        self._owned.remove(group)
        self._stream.settled.add(group.identity)
        self._set_aside_now += 1

    def _recheck_ready(self) -> None:
        """Weights moved on since groups became ready: apply the staleness policy again."""
        for group in [g for g in self._ready if self._stale_slots(g)]:
            self._ready.remove(group)
            self._handle_stale(group)

    def _stale_slots(self, group: Group) -> list[Slot]:
        bound = self._plan.max_staleness
        if bound is None or self._plan.stale == "keep":
            return []
        version = self._hooks.policy.version
        return [
            slot
            for slot in group.slots
            if slot.record is not None and (behind(slot.record, version) or 0) > bound
        ]

    def _handle_stale(self, group: Group) -> None:
        if self._plan.stale == "drop":
            self._owned.remove(group)
            self._metrics.dropped_stale += 1
            self._drops[group.position] += 1
            self._stream.requeue(group.position, group.identity, group.task)
            log.info("dropped stale group %s; its task runs again", group.slots[0].spec.group_id,
                     extra={"stage": "step"})  # fmt: skip
            return
        for slot in self._stale_slots(group):  # restart: the stale samples run again
            self._metrics.restarted_stale += 1
            record = slot.record
            assert record is not None
            self._run(group, slot, first_attempt=record.attempts + 1)


def _read_position(store: Store) -> dict[str, Any] | None:
    return store.read_summary(POSITION)


def _where(store: Store) -> str:
    return f"the {POSITION} summary of experiment {store.exp_id}"
