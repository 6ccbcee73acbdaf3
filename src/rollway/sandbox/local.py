"""A local process sandbox: a fresh working directory, its own session and process group,
resource limits (CPU seconds, memory, open files, processes, file size), a wall-clock timeout
that kills the whole process tree, bounded output capture.

What it isolates: resources, the working directory, the process tree. What it does not:
the file system outside the working directory, the network, the user (it runs as the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rollway.sandbox.base import Sandbox, SandboxLimits, SandboxResult

_TERM_GRACE_S = 2.0


class LocalSandbox(Sandbox):
    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.workdir = Path(tempfile.mkdtemp(prefix="rollway-sandbox-"))
        self._process: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[tuple[bytes, bool]]] = []
        self._started = 0.0
        self._result: SandboxResult | None = None
        self._timed_out = False

    async def start(
        self, command: Sequence[str], env: Mapping[str, str], stdin: bytes = b""
    ) -> None:
        if self._process is not None:
            raise RuntimeError("a sandbox runs one command")
        self._started = time.monotonic()
        self._process = await asyncio.create_subprocess_exec(
            *command,
            cwd=self.workdir,
            env=dict(env),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own session and process group: killed as one
            preexec_fn=self._apply_limits,
        )
        assert self._process.stdin and self._process.stdout and self._process.stderr
        limit = self.limits.output_bytes
        self._readers = [
            asyncio.create_task(_read_bounded(self._process.stdout, limit)),
            asyncio.create_task(_read_bounded(self._process.stderr, limit)),
        ]
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._process.stdin.write(stdin)
            await self._process.stdin.drain()
        self._process.stdin.close()

    def poll(self) -> SandboxResult | None:
        process = self._process
        ended = process is not None and process.returncode is not None
        if self._result is None and ended and all(r.done() for r in self._readers):
            self._result = self._collect()
        return self._result

    async def wait(self) -> SandboxResult:
        if self._result is not None:
            return self._result
        if self._process is None:
            raise RuntimeError("nothing was started")
        try:
            await asyncio.wait_for(self._process.wait(), self.limits.wall_timeout_s)
        except TimeoutError:
            self._timed_out = True
        # Children may outlive the main process (or hold its pipes open): end the group.
        await self._kill_group()
        await self._process.wait()
        await asyncio.gather(*self._readers)
        self._result = self._collect()
        return self._result

    async def destroy(self) -> None:
        try:
            if self._process is not None:
                await self._kill_group()
                with contextlib.suppress(ProcessLookupError):
                    await self._process.wait()
                for reader in self._readers:
                    reader.cancel()
                await asyncio.gather(*self._readers, return_exceptions=True)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def _kill_group(self) -> None:
        """SIGTERM the process group, give it a grace period, then SIGKILL what is left."""
        assert self._process is not None
        group = self._process.pid
        if not _signal_group(group, signal.SIGTERM):
            return
        deadline = time.monotonic() + _TERM_GRACE_S
        # Nothing signals the death of a process group we do not parent: poll it.
        while time.monotonic() < deadline and _group_alive(group):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        _signal_group(group, signal.SIGKILL)

    def _collect(self) -> SandboxResult:
        assert self._process is not None and self._process.returncode is not None
        (out, out_cut), (err, err_cut) = (r.result() for r in self._readers)
        return SandboxResult(
            exit_code=self._process.returncode,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=self._timed_out,
            wall_s=time.monotonic() - self._started,
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
        )

    def _apply_limits(self) -> None:  # runs in the child, between fork and exec
        limits = self.limits
        for kind, value in (
            (resource.RLIMIT_CPU, limits.cpu_seconds),
            (resource.RLIMIT_AS, limits.memory_bytes),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_NPROC, limits.processes),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        ):
            if value is not None:
                # CPU: SIGXCPU at the soft limit (a clear cause), SIGKILL a second later.
                hard = value + 1 if kind == resource.RLIMIT_CPU else value
                resource.setrlimit(kind, (value, hard))


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Keep the first ``limit`` bytes; read and drop the rest so the child never blocks."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
        truncated = truncated or len(chunk) > room
    return bytes(kept), truncated


def _signal_group(group: int, signum: int) -> bool:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        return False
    return True


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
