"""The processes behind ``rollway gateway --workers N``: each a whole gateway (``rollway
gateway`` on its own unix socket, the same engine options and admin key), started, watched,
and started again when it dies.

A rollout's state lives in the one process that registered it, so a worker that dies takes
its rollouts with it. Each worker counts its incarnations (one more at every restart): the
front stamps each rollout with the incarnation that registered it, and a rollout whose worker
has moved on since is known to be lost (``front_app``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from rollway.errors import ConfigError
from rollway.tempdirs import make_owned_tempdir

log = logging.getLogger(__name__)

#: How long a worker may take to answer ``/health`` after it starts (an embedded engine loads
#: a model first).
START_TIMEOUT_S = 300.0
#: Between two starts of a worker that keeps dying at start-up: from the first to the last.
RESTART_BACKOFF_S = (0.5, 30.0)
_POLL_S = 0.05


@dataclass
class Worker:
    """One gateway process; ``session`` reaches it over its socket (open while the pool is)."""

    index: int
    socket_path: str
    session: aiohttp.ClientSession
    process: asyncio.subprocess.Process | None = None
    incarnation: int = 0
    restarts: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def up(self) -> bool:
        return self.ready.is_set()

    def describe(self) -> dict[str, object]:
        pid = self.process.pid if self.process is not None else None
        return {"worker": self.index, "pid": pid, "up": self.up, "restarts": self.restarts}


#: Called with a worker that has just started (again), before it takes requests: what the
#: front must bring it up to (the weights the others sample).
CatchUp = Callable[[Worker], Awaitable[None]]


class WorkerPool:
    """``count`` workers started with ``gateway_args`` (the options of ``rollway gateway``);
    ``start`` returns once all answer, ``stop`` ends them."""

    def __init__(self, count: int, gateway_args: list[str], admin_key: str) -> None:
        if count < 2:
            raise ConfigError(f"a worker pool needs at least 2 workers, not {count}", "workers")
        self.count, self.gateway_args, self.admin_key = count, gateway_args, admin_key
        self.workers: list[Worker] = []
        self.catch_up: CatchUp | None = None
        self._folder: Path | None = None
        self._watchers: list[asyncio.Task[None]] = []

    def route(self, key: str) -> Worker:
        """The worker that holds ``key`` (a rollout or experiment id): a hash that is the same
        in every process and at every start, so it never needs to be remembered."""
        return self.workers[zlib.crc32(key.encode()) % self.count]

    async def start(self) -> None:
        self._folder = make_owned_tempdir("rollway-gateway-workers-")
        for index in range(self.count):
            path = str(self._folder / f"w{index}.sock")
            session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path, limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                auto_decompress=False,
            )
            self.workers.append(Worker(index, path, session))
        try:
            await asyncio.gather(*(self._launch(worker) for worker in self.workers))
        except BaseException:
            await self.stop()
            raise
        self._watchers = [asyncio.create_task(self._watch(w)) for w in self.workers]

    async def stop(self) -> None:
        for watcher in self._watchers:
            watcher.cancel()
        for watcher in self._watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await asyncio.gather(*(_end(w.process) for w in self.workers if w.process))
        for worker in self.workers:
            await worker.session.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    async def _launch(self, worker: Worker) -> None:
        """Start the worker's process and wait until it answers, caught up; a worker that
        exits first is a ``ConfigError`` with its exit status (its stderr is the front's)."""
        command = [sys.executable, "-m", "rollway", "gateway", *self.gateway_args]
        command += ["--workers", "1", "--uds", worker.socket_path]
        env = {**os.environ, "ROLLWAY_ADMIN_KEY": self.admin_key}
        worker.process = await asyncio.create_subprocess_exec(
            *command, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL
        )
        async with asyncio.timeout(START_TIMEOUT_S):
            while not await _answers(worker):
                if worker.process.returncode is not None:
                    raise ConfigError(
                        f"gateway worker {worker.index} exited with status "
                        f"{worker.process.returncode} while starting (its error is above)"
                    )
                await asyncio.sleep(_POLL_S)
        if self.catch_up is not None:
            await self.catch_up(worker)
        worker.ready.set()

    async def _watch(self, worker: Worker) -> None:
        """Start the worker again each time it dies; requests for the rollouts it held are
        answered as lost from the moment its death is seen."""
        backoff = RESTART_BACKOFF_S[0]
        while True:
            assert worker.process is not None
            status = await worker.process.wait()
            worker.ready.clear()
            worker.incarnation += 1
            worker.restarts += 1
            log.error(
                "gateway worker %d (pid %d) exited with status %d: its rollouts are lost; "
                "starting it again",
                worker.index,
                worker.process.pid,
                status,
            )
            try:
                await self._launch(worker)
                backoff = RESTART_BACKOFF_S[0]
            except Exception as exc:
                log.error("gateway worker %d did not start again: %s", worker.index, exc)
                if worker.process.returncode is None:
                    await _end(worker.process)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RESTART_BACKOFF_S[1])


async def _answers(worker: Worker) -> bool:
    try:
        async with worker.session.get("http://worker/health") as answer:
            return answer.status == 200
    except (aiohttp.ClientError, OSError):
        return False


async def _end(process: asyncio.subprocess.Process, grace_s: float = 10.0) -> None:
    """Terminate, then kill what does not exit within ``grace_s``."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        async with asyncio.timeout(grace_s):
            await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
