"""The processes behind ``rollway gateway --workers N``: each a whole gateway (``rollway
gateway`` on its own port, the same engine options and admin key), started, watched, and
started again when it dies, on the same port.

A rollout's turns go straight to its worker's port (the base URL its registration answers):
proxying them through the front would cost the front as much CPU per turn as the worker's
whole turn (measured: ``benchmarks/gateway_workers.py``).

A rollout's state lives in the one process that registered it, so a worker that dies takes
its rollouts with it. No worker outlives the front, however the front ends (SIGKILL
included): each holds the read end of a pipe whose write end only the front holds, and stops
as at a SIGTERM when that pipe is at its end (``watch_front``). Each worker counts its
incarnations (one more at every restart): the front stamps each rollout with the incarnation
that registered it, and a rollout whose worker has moved on since is known to be lost
(``front_app``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from rollway.errors import ConfigError
from rollway.web.uvicorn_server import ServerLimits

log = logging.getLogger(__name__)

#: How long a worker may take to answer ``/health`` after it starts (an embedded engine loads
#: a model first).
START_TIMEOUT_S = 300.0
#: Between two starts of a worker that keeps dying at start-up: from the first to the last.
RESTART_BACKOFF_S = (0.5, 30.0)
_POLL_S = 0.05
#: Names the read end of the front's lifeline in a worker's environment.
LIFELINE_ENV = "ROLLWAY_FRONT_LIFELINE"


@dataclass
class Worker:
    """One gateway process on ``port``; ``url`` is where the front reaches it, ``session``
    how (open while the pool is)."""

    index: int
    port: int
    url: str
    session: aiohttp.ClientSession
    process: asyncio.subprocess.Process | None = None
    incarnation: int = 0
    restarts: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when the current life ends (a new one for each life).
    died: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def up(self) -> bool:
        return self.ready.is_set()

    def describe(self) -> dict[str, object]:
        pid = self.process.pid if self.process is not None else None
        return {
            "worker": self.index,
            "pid": pid,
            "port": self.port,
            "up": self.up,
            "restarts": self.restarts,
        }


#: Called with a worker that has just started (again), before it takes requests: what the
#: front must bring it up to (the weights the others sample).
CatchUp = Callable[[Worker], Awaitable[None]]


class WorkerPool:
    """``count`` workers started with ``gateway_args`` (the options of ``rollway gateway``);
    ``start`` returns once all answer, ``stop`` ends them. They listen on ``host`` (the
    front's), each on a free port chosen at start and kept across its restarts."""

    def __init__(
        self,
        count: int,
        gateway_args: list[str],
        admin_key: str,
        host: str,
        keep_alive_s: float = ServerLimits.keep_alive_s,
    ) -> None:
        if count < 2:
            raise ConfigError(f"a worker pool needs at least 2 workers, not {count}", "workers")
        self.count, self.gateway_args, self.admin_key = count, gateway_args, admin_key
        self.host, self.keep_alive_s = host, keep_alive_s
        self.workers: list[Worker] = []
        self.catch_up: CatchUp | None = None
        self._watchers: list[asyncio.Task[None]] = []
        # Both ends close on exec; each worker is passed the read end alone.
        self._lifeline, self._lifeline_end = os.pipe()

    def route(self, key: str) -> Worker:
        return self.workers[worker_index(key, self.count)]

    async def start(self) -> None:
        # A wildcard address listens on loopback too; the front calls its workers there.
        reach = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        reach = "[::1]" if reach == "::" else f"[{reach}]" if ":" in reach else reach
        for index, port in enumerate(_free_ports(self.host, self.count)):
            # An idle connection is dropped well before the worker's keep-alive closes it:
            # else a request sent as the worker closes it fails (aiohttp does not resend).
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keep_alive_s / 2)
            session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                auto_decompress=False,
            )
            self.workers.append(Worker(index, port, f"http://{reach}:{port}", session))
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
        for fd in (self._lifeline, self._lifeline_end):
            with contextlib.suppress(OSError):
                os.close(fd)

    async def _launch(self, worker: Worker) -> None:
        """Start the worker's process and wait until it answers, caught up; a worker that
        exits first is a ``ConfigError`` with its exit status (its stderr is the front's)."""
        command = [sys.executable, "-m", "rollway", "gateway", *self.gateway_args]
        command += ["--workers", "1", "--host", self.host, "--port", str(worker.port)]
        env = {**os.environ, "ROLLWAY_ADMIN_KEY": self.admin_key, LIFELINE_ENV: str(self._lifeline)}
        # Its own session: a Ctrl-C in the terminal reaches the front alone, which then ends
        # its workers, rather than every worker dying at once and being started again.
        worker.process = await asyncio.create_subprocess_exec(
            *command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=(self._lifeline,),
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
            worker.died.set()
            worker.died = asyncio.Event()
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


def watch_front() -> None:
    """In a worker of ``--workers N``: stop as at a SIGTERM once the front is gone, however it
    ended. Its lifeline's write end closes with it: a read then finds the end of the pipe."""
    fd = os.environ.pop(LIFELINE_ENV, None)
    if fd is not None:
        watcher = threading.Thread(
            target=_stop_at_end_of, args=(int(fd),), name="rollway-front-lifeline", daemon=True
        )
        watcher.start()


def _stop_at_end_of(fd: int) -> None:
    while os.read(fd, 64):  # nothing is written: this returns at the end of the pipe
        pass
    log.error("the front of this gateway worker (rollway gateway --workers) is gone: stopping")
    os.kill(os.getpid(), signal.SIGTERM)


def worker_index(key: str, count: int) -> int:
    """Which of ``count`` workers holds ``key`` (a rollout or experiment id): a hash that is
    the same in every process and at every start, so it never needs to be remembered. Not
    CRC-32: it is linear, and ids that differ in a digit or two (``exp.t1.0.1``,
    ``exp.t2.0.1``) can all land on one worker."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def _free_ports(host: str, count: int) -> list[int]:
    """Ports free on ``host`` now (all held at once, so they differ), for the workers to bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket(family)) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


async def _answers(worker: Worker) -> bool:
    try:
        async with worker.session.get(f"{worker.url}/health") as answer:
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
