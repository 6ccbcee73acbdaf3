"""Where sync reward functions run: daemon threads of rollway's own, never the event loop's
default executor.

A thread stuck in a sync function cannot be stopped. In the default executor (6 threads on 2
cores) six hung graders would hold every thread: the store's writes and reads, which go there
too, would wait behind them and no rollout would be recorded; and its threads are joined at
exit, so the process would never end. Here a try that times out leaves its thread behind,
abandoned, and the next call starts a new one: hung graders cost threads, not the batch, and
being daemon threads they never hold the process open.

Threads, not processes: a reward function may be a closure, is given the task and trajectory
by reference, reads the judge's scope (a context variable) and calls ``run_sync`` on its
environment (which calls back into the event loop); a process would need all of it pickled
and would lose the last two. What a reward starts itself (a child process, a detached helper)
is therefore its own to end (docs/agents.md, "What a reward may start"), except a forked copy
of the process that returns into this module: it ends at once."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: An idle thread ends after this long without work (the next call starts another).
IDLE_S = 30.0


@dataclass(frozen=True, slots=True)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    context: contextvars.Context
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


class RewardThreads:
    """Daemon threads for sync calls: an idle one takes the next call, else a new one starts.
    ``running`` counts the threads in a call, those whose caller gave up on them included."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self._idle_s = idle_s
        self._lock = threading.Lock()
        #: Each idle thread's inbox; a call takes the last one (the warmest thread).
        self._idle: list[queue.SimpleQueue[_Job]] = []
        self._started = 0
        self._names = itertools.count(1)

    @property
    def running(self) -> int:
        with self._lock:
            return self._started - len(self._idle)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on one of the threads, in a copy of the caller's context (as
        ``asyncio.to_thread``); cancelling the caller abandons the call, which runs on."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        job = _Job(fn, args, contextvars.copy_context(), loop, future)
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                self._started += 1
        if inbox is None:
            inbox = queue.SimpleQueue()
            name = f"rollway-reward-{next(self._names)}"
            threading.Thread(target=self._serve, args=(inbox,), name=name, daemon=True).start()
        inbox.put(job)
        return await future

    def _serve(self, inbox: queue.SimpleQueue[_Job]) -> None:
        while True:
            try:
                job = inbox.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # not taken by a call meanwhile: end
                        self._idle.remove(inbox)
                        self._started -= 1
                        return
                continue  # a call took this thread as it timed out: its job is on the way
            _answer(job)
            del job  # the task and trajectory are not held while idle
            with self._lock:
                self._idle.append(inbox)


def _answer(job: _Job) -> None:
    pid = os.getpid()
    try:
        outcome: tuple[bool, Any] = (True, job.context.run(job.fn, *job.args))
    except BaseException as exc:  # the caller's to judge (sys.exit() included)
        outcome = (False, exc)
    if os.getpid() != pid:
        # A child the function forked came back here: a copy of the whole client, whose event
        # loop thread did not follow it. It ends now rather than linger, or run on as a copy.
        os._exit(0)
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for this any more
        job.loop.call_soon_threadsafe(_settle, job.future, outcome)


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():  # the caller gave up (its try timed out, or it was cancelled)
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


#: The threads every sync reward function runs on.
REWARD_THREADS = RewardThreads()
