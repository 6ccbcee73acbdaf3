"""``in_thread``: a blocking call off the loop that holds nothing of its caller's once awaited."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Callable
from typing import Any

from rollway.loop_thread import in_thread


class Lingering(concurrent.futures.ThreadPoolExecutor):
    """Runs each call on a thread that stays on it after it answers (as a worker thread is
    still waking the loop), until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            result = fn(*args, **kwargs)
            future.set_result(result)
            self.release.wait(timeout=30)  # fn, args and result still held by this frame

        self.threads.append(threading.Thread(target=run, daemon=True))
        self.threads[-1].start()
        return future


class Record:
    pass


def test_the_thread_lets_go_of_the_arguments_and_result_before_the_caller_resumes() -> None:
    executor = Lingering()

    async def scenario() -> tuple[weakref.ref[Record], weakref.ref[Record]]:
        asyncio.get_running_loop().set_default_executor(executor)
        given = Record()
        answer = await in_thread(lambda record: Record() if record else None, given)
        refs = weakref.ref(given), weakref.ref(answer)
        del given, answer
        return refs

    try:
        given, answer = asyncio.run(scenario())
        assert given() is None and answer() is None  # freed at the caller's del
    finally:
        executor.release.set()
        for thread in executor.threads:
            thread.join(timeout=30)
