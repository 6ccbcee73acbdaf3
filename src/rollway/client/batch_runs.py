"""A client's batches: what resume leaves to run, submitted under the experiment's lease and
yielded as they finish, with a bar and status lines, the run's config and its summary in the
store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import itertools
import logging
import queue
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rollway.agents.base import AgentLoop
from rollway.client.batch import BatchItem, plan, rerun_reason
from rollway.client.batch_summary import BatchTally
from rollway.client.fingerprint import agent_identity
from rollway.client.future import RolloutFuture
from rollway.client.lease_keeper import LeaseKeeper
from rollway.client.progress import BatchProgress, summary_table
from rollway.client.watchdog import Watchdog
from rollway.errors import BadRecordError
from rollway.executors import Executor, LocalExecutor
from rollway.loop_thread import LoopThread
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutSpec
from rollway.store.base import Store

log = logging.getLogger(__name__)

#: Starts one rollout: the client's own ``_submit``.
Submit = Callable[[RolloutSpec, RolloutConfig], RolloutFuture]


@dataclass(frozen=True)
class BatchRequest:
    """One batch as it was asked for, checked; how it shows is the client's at that time."""

    tasks: list[dict[str, Any]]
    group_size: int
    resume: bool
    settings: RolloutConfig
    #: What its records will say made them; resume returns only records that say the same.
    fingerprint: dict[str, Any]
    show_progress: bool
    status_interval: float


class BatchRuns:
    """The client's batches, over the parts of the client they use. ``last_summary``: the
    summary of the last batch that ended (None before)."""

    def __init__(
        self,
        *,
        exp_id: str,
        agent: AgentLoop,
        store: Store,
        executor: Executor,
        submit: Submit,
        lease: LeaseKeeper,
        loop: LoopThread,
        watchdog: Watchdog,
    ) -> None:
        self.exp_id, self.agent, self.store, self.executor = exp_id, agent, store, executor
        self._submit = submit
        self._lease, self._loop = lease, loop
        self._watchdog = watchdog
        self.last_summary: dict[str, Any] | None = None

    def run(self, request: BatchRequest) -> Iterator[BatchItem]:
        return self._run(request)

    def run_async(self, request: BatchRequest) -> AsyncIterator[BatchItem]:
        return self._leased_async(self._run_async(request))

    async def _leased_async(
        self, items: AsyncGenerator[BatchItem, None]
    ) -> AsyncIterator[BatchItem]:
        with self._lease.held(self._loop):
            async with contextlib.aclosing(items):
                async for item in items:
                    yield item

    def _run(self, request: BatchRequest) -> Generator[BatchItem, None, None]:
        """A batch under the experiment's lease, taken before it plans anything. One generator
        frame, not a wrapper delegating to one: a Ctrl-C (or SIGTERM) lands in whichever frame
        runs when it comes, and one that landed in a wrapper closed the batch with
        ``GeneratorExit``, which counts nothing: the summary left out the cancelled rollouts
        (recorded all the same)."""
        with self._lease.held(self._loop):
            started = time.monotonic()
            done, todo, reruns = self._prepare(request)
            counted = _resumed(done)
            finished: queue.SimpleQueue[concurrent.futures.Future[RolloutRecord]] = (
                queue.SimpleQueue()
            )
            starts = _Starts(self._submit, self._loop, todo, request.settings, finished.put)
            try:
                with (
                    self._progress(len(done) + len(todo), request) as progress,
                    _frozen_in_flight(),
                ):
                    try:
                        yield from _from_store(done, progress)
                        while starts.running or starts.left:
                            # Wake for the next status line too: a stuck batch still reports.
                            try:
                                if starts.left:  # a slice at a time: the loop stays responsive
                                    starts.next_slice()
                                    cf = finished.get_nowait()
                                else:
                                    cf = finished.get(timeout=progress.until_status())
                            except queue.Empty:
                                progress.tick()
                                continue
                            yield starts.item(cf, counted, progress)
                    finally:
                        starts.rest()  # cancelled at once: every rollout gets its record
                        cancel_and_wait(starts.futures)
            except KeyboardInterrupt:
                # Every rollout has its record now: what finished, and the cancelled rest.
                for future in starts.futures:
                    if future.done() and not future._future.exception():
                        counted.add(future._future.result())
                wall_s = time.monotonic() - started
                self._finish(request, counted, wall_s, reruns, interrupted=True)
                raise
            self._finish(request, counted, time.monotonic() - started, reruns)

    async def _run_async(self, request: BatchRequest) -> AsyncGenerator[BatchItem, None]:
        """``_run`` on the caller's event loop: the same slices, each awaited, not waited on."""
        started = time.monotonic()
        done, todo, reruns = self._prepare(request)
        counted = _resumed(done)
        caller = asyncio.get_running_loop()
        finished: asyncio.Queue[concurrent.futures.Future[RolloutRecord]] = asyncio.Queue()

        def on_done(cf: concurrent.futures.Future[RolloutRecord]) -> None:
            caller.call_soon_threadsafe(finished.put_nowait, cf)

        starts = _Starts(self._submit, self._loop, todo, request.settings, on_done)
        with self._progress(len(done) + len(todo), request) as progress, _frozen_in_flight():
            try:
                for item in _from_store(done, progress):
                    yield item
                while starts.running or starts.left:
                    if starts.left:  # a slice at a time, as ``_run``
                        await starts.next_slice_async()
                        if finished.empty():
                            continue
                    try:
                        cf = await asyncio.wait_for(finished.get(), progress.until_status())
                    except TimeoutError:
                        progress.tick()
                        continue
                    yield starts.item(cf, counted, progress)
            finally:
                starts.rest()
                await asyncio.to_thread(cancel_and_wait, starts.futures)
        self._finish(request, counted, time.monotonic() - started, reruns)

    def _progress(self, total: int, request: BatchRequest) -> BatchProgress:
        return BatchProgress(
            total,
            show=request.show_progress,
            status_interval_s=request.status_interval,
            stuck=lambda: self._watchdog.stuck,
            outages=self._outages,
        )

    def _outages(self) -> list[str]:
        """What this process's rollouts wait for (Ray workers keep their own)."""
        if isinstance(self.executor, LocalExecutor):
            return self.executor.availability.status()
        return []

    def _prepare(
        self, request: BatchRequest
    ) -> tuple[list[BatchItem], list[tuple[int, RolloutSpec]], Counter[str]]:
        """What resume found done, what is left to run, and why stored records are run again
        (counted by reason)."""
        run_id = uuid.uuid4().hex
        specs = plan(request.tasks, request.group_size, self.exp_id, run_id, request.fingerprint)
        self.store.write_config(self._config(request))
        done: list[BatchItem] = []
        todo: list[tuple[int, RolloutSpec]] = []
        reruns: Counter[str] = Counter()
        stored_keys = self.store.keys() if request.resume else set()  # one listing, not a read each
        for index, spec in enumerate(specs):
            try:
                stored = (
                    self.store.get(spec.rollout_key) if spec.rollout_key in stored_keys else None
                )
                if stored is not None and stored.trajectory is not None:
                    stored.trajectory.check()  # a record its samples refuse is never handed back
                why = None if stored is None else rerun_reason(stored, request.fingerprint)
            except BadRecordError as exc:
                log.warning("running rollout %s again: %s", spec.rollout_key, exc)
                stored, why = None, "bad record"
            if stored is None or why is not None:
                todo.append((index, spec))
                reruns.update([why] if why is not None else [])
            else:
                if self.executor.light_records:
                    stored = stored.light()
                done.append(BatchItem.of(stored, index, 0.0, from_store=True))
        if request.resume:
            _say_resumed(len(done), len(specs), reruns, show=request.show_progress)
        return done, todo, reruns

    def _finish(
        self,
        request: BatchRequest,
        counted: BatchTally,
        wall_s: float,
        reruns: Counter[str],
        *,
        interrupted: bool = False,
    ) -> None:
        groups = [g.to_dict() for g in counted.groups()]
        self.store.write_summary("groups", {"groups": groups})
        summary = counted.summary(wall_s, interrupted=interrupted, rerun=reruns)
        self.last_summary = summary.to_dict()
        self.store.write_summary("summary", self.last_summary)
        if request.show_progress:
            BatchProgress(0, show=False).console.print(summary_table(summary))

    def _config(self, request: BatchRequest) -> dict[str, Any]:
        return {
            "exp_id": self.exp_id,
            "agent": agent_identity(self.agent),
            "agent_name": self.agent.name,
            "model": self.executor.model_name,
            **self.executor.describe(),
            "tasks": len(request.tasks),
            "group_size": request.group_size,
            **request.settings.to_dict(),
            "status_interval": request.status_interval,
            "written_at": time.time(),
        }


#: Rollouts a batch starts before it waits for the client's loop to take them: a status line
#: or any other call on the loop waits behind one slice, not behind the whole batch.
START_SLICE = 128


class _Starts:
    """A batch's rollouts submitted a slice at a time, each slice taken by the client's
    event loop before the next goes (submitted at once, 30,000 starts kept the loop from
    anything else for 12 s). ``futures``: those submitted and not yet yielded, by handle, with
    their index in the batch; ``running``: how many of them (by concurrent future)."""

    def __init__(
        self,
        submit: Submit,
        loop: LoopThread,
        todo: list[tuple[int, RolloutSpec]],
        settings: RolloutConfig,
        on_done: Callable[[concurrent.futures.Future[RolloutRecord]], None],
    ) -> None:
        self._submit, self._loop, self._settings, self._on_done = submit, loop, settings, on_done
        self._todo = iter(todo)
        self.left = len(todo)
        self.futures: dict[RolloutFuture, int] = {}
        self._by_cf: dict[concurrent.futures.Future[RolloutRecord], RolloutFuture] = {}

    @property
    def running(self) -> int:
        return len(self._by_cf)

    def _submit_slice(self, size: int | None) -> concurrent.futures.Future[None]:
        """Submit the next ``size`` rollouts (a slice); the future says when the loop took
        them. What is alive now is the in-flight state of the slices before: frozen out of
        the collector's scans (``_frozen_in_flight``)."""
        for index, spec in itertools.islice(self._todo, size or START_SLICE):
            future = self._submit(spec, self._settings)
            self.futures[future] = index
            self._by_cf[future._future] = future
            future._future.add_done_callback(self._on_done)
            self.left -= 1
        gc.freeze()
        return self._loop.submit(_taken())

    def next_slice(self, size: int | None = None) -> None:
        self._submit_slice(size).result()

    async def next_slice_async(self) -> None:
        await asyncio.wrap_future(self._submit_slice(None))

    def rest(self) -> None:
        """Submit what is left at once (the batch is being left: each is cancelled)."""
        if self.left:
            self._submit_slice(self.left)

    def item(
        self,
        cf: concurrent.futures.Future[RolloutRecord],
        counted: BatchTally,
        progress: BatchProgress,
    ) -> BatchItem:
        """The finished rollout ``cf`` as its batch item, counted, and let go of."""
        future = self._by_cf.pop(cf)
        record = cf.result()
        counted.add(record)
        progress.advance(record)
        return BatchItem.of(record, self.futures.pop(future), future.elapsed())


@contextlib.contextmanager
def _frozen_in_flight() -> Iterator[None]:
    """While a batch runs, the state of its rollouts in flight (some 60 objects each, 6
    million at 100,000) is frozen out of the cyclic collector's scans after each slice, and
    given back to it when the batch ends: a full collection otherwise walked all of it, every
    thread stopped meanwhile (6.7 s at 100,000 in flight). A finished rollout is freed by its
    reference counts all the same; only cyclic garbage made before a slice waits until the
    batch ends, and a rollout leaves none (``RolloutFuture``)."""
    try:
        yield
    finally:
        gc.unfreeze()


def _resumed(done: list[BatchItem]) -> BatchTally:
    counted = BatchTally()
    for item in done:
        counted.add(item.result, ran=False)
    return counted


def _from_store(done: list[BatchItem], progress: BatchProgress) -> Iterator[BatchItem]:
    """What resume found done, each let go of once yielded."""
    done.reverse()
    while done:
        item = done.pop()
        progress.advance(item.result)
        yield item


async def _taken() -> None:
    """Returns once the loop has run what was submitted before it."""


def cancel_and_wait(futures: Iterable[RolloutFuture]) -> None:
    pending = [f for f in futures if not f.done()]
    for future in pending:
        future.cancel()
    concurrent.futures.wait([f._future for f in pending])


def _say_resumed(reused: int, total: int, reruns: Counter[str], *, show: bool) -> None:
    """One line before a resuming batch starts: how many records it returns from the store,
    and why it runs stored ones again (another policy version, other settings, ...)."""
    line = f"resume: {reused} of {total} rollouts from the store"
    if reruns:
        whys = "; ".join(f"{n} {why}" for why, n in reruns.most_common())
        line += f"; {reruns.total()} stored run again: {whys}"
    log.info(line, extra={"stage": "resume"})
    # Once: ``rollway run`` logs the client's lines at INFO, and a caller may too.
    if show and not log.isEnabledFor(logging.INFO):
        console = BatchProgress(0, show=False).console
        console.print(line, highlight=False, markup=False, soft_wrap=True)
