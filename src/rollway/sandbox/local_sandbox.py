"""A local process sandbox: a fresh working directory, its own session, resource limits (CPU
seconds, memory, open files, processes, file size), a wall-clock timeout, bounded output capture,
and teardown that ends every process the command started.

The command runs under ``supervisor.py``, a child subreaper that outlives none of its
descendants (daemons that ``setsid`` included) and ends them when the command ends, so the
sandbox waits for the command, never for whoever else holds its output pipes. Where the cgroup
file system is writable the sandbox also gets a pids cgroup (``cgroup.py``): a process limit that
binds root too, and a list of every process for the final kill. As root without one, the process
limit is only ``RLIMIT_NPROC``, which root ignores: that is logged once as a warning.

Nothing of it outlives the client, however the client ends: the supervisor watches a pipe
whose write end only the client holds (its end of file is a SIGTERM, see ``supervisor.py``), and
gets a SIGTERM (``_ORPHAN_SIGNAL``) as the parent-death signal as well. That signal comes when
the *thread* that forked it ends: the event loop's thread, which outlives its sandboxes; the pipe
covers the rest, and the signal covers a forked copy of the client that keeps the pipe open. The
working directory is marked as the client's (``rollway.tempdirs``): one a killed client left is
removed by the next client that opens (``rollway.sandbox.remove_leftovers``). It is held open
from its making (``workdir.py``): the client reads the program's files, and the supervisor writes
the exit status, in that folder, whatever the program did to its path. A supervisor killed
before it wrote that status is rollway's failure, not the program's (``supervisor_death.py``):
``wait`` raises ``InfrastructureError`` and its orphans (the rest of its session) are killed.

What it isolates: resources, the working directory, the process tree. What it does not:
the file system outside the working directory, the network, Unix sockets, other processes and
their environments (admin keys included), the user (it runs as the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rollway.errors import AgentError, InfrastructureError
from rollway.sandbox.base import Sandbox, SandboxLimits, SandboxResult
from rollway.sandbox.cgroup import PidsCgroup
from rollway.sandbox.readback import read_back
from rollway.sandbox.supervisor_death import local_death, session_members
from rollway.sandbox.workdir import make_workdir, remove_workdir

log = logging.getLogger(__name__)

_TERM_GRACE_S = 2.0
_TERM_REPEAT_S = 0.25
_KILL_POLL_S = 0.02
_STATUS_FILE = ".rollway-exit-code"
_STATUS_BYTES = 32  # an exit code; the program may have put anything there
_STDERR_TAIL = 2000  # of a failed sandbox's stderr, in its error
_SUPERVISOR = Path(__file__).with_name("supervisor.py")
_PR_SET_PDEATHSIG = 1


class LocalSandbox(Sandbox):
    #: What the first process (the supervisor) gets when the client dies: SIGTERM, so that it
    #: ends its tree in order.
    _ORPHAN_SIGNAL = signal.SIGTERM

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.workdir, workdir_fd = make_workdir("rollway-sandbox-")
        self._workdir_fd: int | None = workdir_fd  # None once destroyed
        self._process: asyncio.subprocess.Process | None = None
        self._lifeline: int | None = None  # the write end; the supervisor watches the other
        self._client_pid = 0
        self._cgroup: PidsCgroup | None = None
        self._pipes: list[asyncio.ReadTransport] = []
        self._readers: list[asyncio.Task[tuple[bytes, bool]]] = []
        self._started = 0.0
        self._result: SandboxResult | None = None
        self._timed_out = False
        self._wall_s = self.limits.wall_timeout_s

    async def start(
        self, command: Sequence[str], env: Mapping[str, str], stdin: bytes = b""
    ) -> None:
        if self._process is not None or self._workdir_fd is None:
            raise RuntimeError("a sandbox starts one command, before it is destroyed (run more)")
        self._cgroup = PidsCgroup.create(self.limits.processes)
        if self._cgroup is None and self.limits.processes is not None and os.geteuid() == 0:
            _warn_process_limit_does_not_bind()
        self._started = time.monotonic()
        _libc()  # loaded here, for the child to use between fork and exec
        self._client_pid = os.getpid()
        # Output through pipes of our own, stdin from a file: asyncio then waits for the
        # process's exit alone, and a program that never reads its stdin cannot block us.
        (out, out_w), (err, err_w) = os.pipe(), os.pipe()
        lifeline, self._lifeline = os.pipe()  # both close on exec: only what we pass is passed
        try:
            with tempfile.TemporaryFile() as stdin_file:
                stdin_file.write(stdin)
                stdin_file.seek(0)
                self._process = await asyncio.create_subprocess_exec(
                    *self._wrap(command, env, lifeline),
                    cwd=self.workdir,
                    env=dict(env),
                    stdin=stdin_file,
                    stdout=out_w,
                    stderr=err_w,
                    pass_fds=(lifeline, self._workdir_fd),
                    start_new_session=True,  # its own session and process group
                    preexec_fn=self._prepare_child,
                )
        except BaseException:
            os.close(out)
            os.close(err)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
            os.close(lifeline)
        for fd in (out, err):
            reader, pipe = await _open_pipe(fd)
            self._pipes.append(pipe)
            self._readers.append(
                asyncio.create_task(_read_bounded(reader, self.limits.output_bytes))
            )

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
            await asyncio.wait_for(self._process.wait(), self._wall_s)
        except TimeoutError:
            self._timed_out = True
        await self._end_processes()
        # Every writer is gone, so the pipes are at their end; should one have escaped
        # anyway, keep what was read rather than wait for it.
        await asyncio.wait(self._readers, timeout=_TERM_GRACE_S)
        for pipe in self._pipes:
            pipe.close()
        await asyncio.gather(*self._readers)
        self._result = self._collect()
        return self._result

    async def run(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        stdin: bytes = b"",
        timeout_s: float | None = None,
    ) -> SandboxResult:
        if self._workdir_fd is None:
            raise RuntimeError("the sandbox was destroyed")
        if self._process is not None:
            if self._process.returncode is None:
                raise RuntimeError("the sandbox's command still runs: wait for it first")
            await self._release_run()  # ended, waited for or cut short by a cancel
        walls = [s for s in (self.limits.wall_timeout_s, timeout_s) if s is not None]
        self._wall_s = min(walls) if walls else None
        await self.start(command, env, stdin)
        try:
            return await self.wait()
        except BaseException:  # cancelled (the caller's own timeout): nothing of it runs on
            await self._end_processes()
            raise

    async def _release_run(self) -> None:
        """Forget the ended command (its pipes, cgroup and lifeline), so another can start."""
        for pipe in self._pipes:
            pipe.close()
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        self._pipes, self._readers = [], []
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        self._process, self._result, self._timed_out = None, None, False

    async def destroy(self) -> None:
        try:
            if self._process is not None:
                await self._end_processes()
        finally:
            for pipe in self._pipes:
                pipe.close()
            for reader in self._readers:
                reader.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)
            if self._cgroup is not None:
                self._cgroup.remove()
                self._cgroup = None
            if self._lifeline is not None:
                os.close(self._lifeline)
                self._lifeline = None
            if self._workdir_fd is not None:
                remove_workdir(self.workdir, self._workdir_fd)
                self._workdir_fd = None

    def read_back(self, name: str, limit: int, what: str, setting: str = "") -> bytes | None:
        if self._workdir_fd is None:
            raise RuntimeError("the sandbox was destroyed")
        # A copy: read in a thread, a read a teardown overtakes never uses a reused number.
        folder = os.dup(self._workdir_fd)
        try:
            return read_back(self.workdir / name, limit, what, setting, dir_fd=folder)
        finally:
            os.close(folder)

    def _wrap(self, command: Sequence[str], env: Mapping[str, str], lifeline: int) -> list[str]:
        """The command line that runs ``command`` under its supervisor."""
        # Isolated mode: the program's PYTHONPATH and such do not reach the supervisor.
        supervisor = [sys.executable, "-I", "-S", str(_SUPERVISOR), "--status", _STATUS_FILE]
        options = ["--workdir-fd", str(self._workdir_fd), "--grace", str(_TERM_GRACE_S)]
        options += ["--lifeline", str(lifeline)]
        return [*supervisor, *options, *self._supervisor_options(env), "--", *command]

    def _supervisor_options(self, env: Mapping[str, str]) -> list[str]:
        return []

    async def _end_processes(self) -> None:
        """SIGTERM the group (the supervisor, and unshare in a namespace sandbox): the
        supervisor ends its tree within the grace period. Then kill by force what is left: the
        group if it did not end, every process of the cgroup."""
        process = self._process
        assert process is not None
        deadline = time.monotonic() + _TERM_GRACE_S + 1.0  # its grace, and a margin
        while process.returncode is None and time.monotonic() < deadline:
            # Again until it ends: a process forked after the last one missed it (only the
            # supervisor acts on it, once, so its descendants get one SIGTERM however many).
            _signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), _TERM_REPEAT_S)
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGKILL)
        if await process.wait() < 0:  # killed: what it had not ended yet is orphaned
            await _kill_session(process.pid)
        if self._cgroup is not None:
            deadline = time.monotonic() + _TERM_GRACE_S
            # Nothing signals a v1 cgroup's emptying: poll it (the kill itself is immediate).
            while self._cgroup.kill() and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(_KILL_POLL_S)

    def _collect(self) -> SandboxResult:
        assert self._process is not None and self._process.returncode is not None
        (out, out_cut), (err, err_cut) = (r.result() for r in self._readers)
        stderr = err.decode(errors="replace")
        try:  # the command's own code, as its supervisor saw it
            status = self.read_back(_STATUS_FILE, _STATUS_BYTES, "exit status file")
        except AgentError:  # the program meddled, and the supervisor could not replace it
            status = b""
        death = None if status is not None or self._timed_out else self._supervisor_death(stderr)
        if death is not None:
            tail = stderr[-_STDERR_TAIL:].strip()
            raise InfrastructureError(f"{death}; stderr: {tail}" if tail else death)
        try:
            exit_code = int(status or b"")
        except ValueError:  # none, or not a number: the supervisor's own code stands
            exit_code = self._process.returncode
        return SandboxResult(
            exit_code=exit_code,
            stdout=out.decode(errors="replace"),
            stderr=stderr,
            timed_out=self._timed_out,
            wall_s=time.monotonic() - self._started,
            stdout_truncated=out_cut,
            stderr_truncated=err_cut,
        )

    def _supervisor_death(self, stderr: str) -> str | None:
        """Why the supervisor died before it wrote the status file, if it did (then rollway's
        machinery failed, not the program: ``supervisor_death``); None if it ended on its own."""
        assert self._process is not None and self._process.returncode is not None
        return local_death(self._process.returncode)

    def _prepare_child(self) -> None:  # runs in the child, between fork and exec
        if self._cgroup is not None:
            self._cgroup.join()
        # Kept pending until the supervisor is ready to act on it (through unshare, which
        # passes its mask on): a sandbox destroyed as it starts still ends in order.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        _set_parent_death_signal(self._ORPHAN_SIGNAL, self._client_pid)
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


@functools.cache
def _libc() -> ctypes.CDLL:
    """Loaded before any fork: loading it between fork and exec could wait on a lock that
    another thread of the client held when it forked."""
    return ctypes.CDLL(None, use_errno=True)


def _set_parent_death_signal(signum: int, parent: int) -> None:
    """``signum`` when the forking thread ends (in the child, between fork and exec; exec keeps
    it). If the client died before this, the signal would never come: send it now."""
    if _libc().prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


@functools.cache
def _warn_process_limit_does_not_bind() -> None:
    log.warning(
        "sandboxes run as root without a pids cgroup (the cgroup file system is not writable):"
        " their process limit (RLIMIT_NPROC) does not bind root, so a fork bomb is not"
        " contained; run as another user or where /sys/fs/cgroup is writable"
    )


async def _open_pipe(fd: int) -> tuple[asyncio.StreamReader, asyncio.ReadTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    return reader, pipe


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Keep the last ``limit`` bytes (an error's cause comes last); read and drop the rest so
    the child never blocks."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > limit:
            del kept[: len(kept) - limit]
            truncated = True
    return bytes(kept), truncated


async def _kill_session(session: int) -> None:
    """SIGKILL what is left of a killed supervisor's session (its orphans), again until none
    is left: one may fork as it is killed."""
    deadline = time.monotonic() + _TERM_GRACE_S
    while (left := session_members(session)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(_KILL_POLL_S)  # a SIGKILL lands at once, its end comes soon after


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)
