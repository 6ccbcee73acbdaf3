"""A private event loop on a daemon thread, so sync callers can drive async rollouts; and
blocking calls run off a loop without outliving their caller's hold (``in_thread``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


async def in_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``asyncio.to_thread(fn, ...)``, except that the thread has let go of the arguments and
    the result by the time the awaiting coroutine resumes. ``to_thread``'s thread holds both
    until it is back from waking the loop, which under load is after the loop has run on: a
    finished rollout's record written this way outlived its caller's ``del`` (no cycle, a
    race that ``gc.disable()`` cannot hide)."""
    box: list[Any] = [functools.partial(fn, *args, **kwargs)]
    await asyncio.to_thread(_call_in_box, box)
    result: T = box.pop()
    return result


def _call_in_box(box: list[Any]) -> None:
    box.append(box.pop()())  # the call and its arguments are let go of before this returns


#: How long ``run_to_end`` gives the tasks ``main`` left running to end once cancelled.
LEFTOVER_GRACE_S = 2.0


def run_to_end(main: Coroutine[Any, Any, T], grace_s: float = LEFTOVER_GRACE_S) -> T:
    """``asyncio.run(main)``, except that the tasks it leaves running are cancelled and given
    ``grace_s`` to end, then left behind: ``asyncio.run`` waits for them for ever, so one
    that swallows its cancellation (a reward abandoned with a warning) would hang its caller
    after the work was done."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left, timeout=grace_s))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


class LoopThread:
    def __init__(self, name: str = "rollway-client") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
