"""Rewards that need the environment: a test suite run in the agent's sandbox, a file the
program wrote. A reward function says so explicitly (``@uses_environment``, or a ``Rubric``
with such a function); it is then called as ``fn(task, trajectory, environment)`` with the
finished rollout's ``RolloutEnvironment``: the program agent's sandbox, kept after its program
ended until the rollout is scored (each of the reward's tries), then torn down. Its commands run
in that sandbox, under its limits (a namespace sandbox's included: no network at all, since the
rollout's gateway is not relayed to them). A recorded run has no environment left: rescoring
with such a reward is refused (``needs_environment``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rollway.errors import ConfigError
from rollway.sandbox.base import Sandbox, SandboxResult

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute ``uses_environment`` sets (a ``Rubric`` sets it when one of its functions has).
MARK = "uses_environment"


def uses_environment(reward_fn: F) -> F:
    """Marks ``reward_fn`` (sync or async) as one called with the rollout's environment as its
    third argument: ``fn(task, trajectory, environment)``."""
    setattr(reward_fn, MARK, True)
    return reward_fn


def needs_environment(reward_fn: object) -> bool:
    """Whether ``reward_fn`` said it takes the environment (``@uses_environment``)."""
    return getattr(reward_fn, MARK, False) is True


def check_environment(reward_fn: object, agent: object) -> None:
    """A ``ConfigError`` before anything runs when ``reward_fn`` uses the environment and
    ``agent`` has none to lend (only a program agent's sandbox is)."""
    if needs_environment(reward_fn) and not getattr(agent, "lends_environment", False):
        raise ConfigError(
            f"the reward uses the rollout's environment (@uses_environment), which "
            f"{type(agent).__name__} does not lend: run a program agent (--cmd, ProgramAgent), "
            "whose sandbox the reward gets, or score from the trajectory alone",
            "reward",
        )


def refuse_rescoring(reward_fn: object) -> None:
    """A ``ConfigError`` when ``reward_fn`` uses the environment: a recorded rollout's sandbox
    was torn down once it was scored."""
    if needs_environment(reward_fn):
        raise ConfigError(
            "the reward uses the rollout's environment (@uses_environment): a recorded run's "
            "sandboxes were torn down when its rollouts were scored, so it cannot be rescored; "
            "rescore with a reward that reads the trajectory, or run the rollouts again",
            "reward",
        )


class RolloutEnvironment:
    """A finished program rollout's sandbox, lent to its reward: ``workdir``, the folder the
    program worked in (with the files it left), and ``run``, a command in that sandbox under its
    limits. Commands run one at a time."""

    def __init__(self, sandbox: Sandbox, env: dict[str, str]) -> None:
        self.sandbox = sandbox
        self.workdir: Path = sandbox.workdir
        self._env = env
        self._turn = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._closed = False
        #: ``run_sync`` calls in flight: a sync try that timed out leaves its thread behind,
        #: and ``end_abandoned`` ends their commands so that the next try has the sandbox.
        self._sync_runs: set[concurrent.futures.Future[SandboxResult]] = set()

    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes = b"",
        env: dict[str, str] | None = None,
    ) -> SandboxResult:
        """Run ``command`` (a list, or a string split as a shell would) in the working folder
        and wait for it: its exit code, output (bounded as the program's) and whether it ran
        out of time (the shorter of the sandbox's ``wall_timeout_s`` and ``timeout_s``). Its
        environment is ``PATH``, ``HOME`` (the folder) and ``ROLLWAY_TASK_FILE``, plus ``env``;
        never the rollout's model key. A reward's try that times out ends the command."""
        words = shlex.split(command) if isinstance(command, str) else list(command)
        if not words:
            raise ValueError("RolloutEnvironment.run needs a command")
        async with self._turn:
            if self._closed:
                raise RuntimeError("the rollout's environment is gone: it was scored already")
            return await self.sandbox.run(
                words, {**self._env, **(env or {})}, stdin=stdin, timeout_s=timeout_s
            )

    def run_sync(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes = b"",
        env: dict[str, str] | None = None,
    ) -> SandboxResult:
        """``run`` for a sync reward (it runs on a worker thread): waits for the command. A try
        that times out abandons its thread; its command is ended then (``end_abandoned``)."""
        if _on_loop(self._loop):
            raise RuntimeError("run_sync is for sync rewards; an async one awaits run(...)")
        call = self.run(command, timeout_s=timeout_s, stdin=stdin, env=env)
        running = asyncio.run_coroutine_threadsafe(call, self._loop)
        self._sync_runs.add(running)
        try:
            return running.result()
        finally:
            self._sync_runs.discard(running)

    def end_abandoned(self) -> None:
        """End the commands of sync tries that timed out (their threads cannot be stopped)."""
        for running in list(self._sync_runs):
            running.cancel()  # cancels its task on the loop: the command's tree is ended

    async def close(self) -> None:
        """Tear the sandbox down (after the last try): what runs ends, the folder goes."""
        self._closed = True
        await self.sandbox.destroy()


def reward_env(workdir: Path) -> dict[str, str]:
    """What a reward's command gets: enough to run tools, nothing of the rollout's keys."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "ROLLWAY_TASK_FILE": str(workdir / "task.json"),
    }


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
