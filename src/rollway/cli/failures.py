"""How the ``rollway`` command fails: the one mapping from an exception to what the user reads.

A failure is one ``error:`` line and one ``hint:`` line on stderr, and exit status 1. Tracebacks
only with ``ROLLWAY_DEBUG=1``, for known errors and for bugs alike. Exit statuses:
0 done, 1 failed (``error:``), 2 a usage error (click's), 130 interrupted (Ctrl-C), 143 stopped
by a SIGTERM (``cli.stopping``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

import typer

from rollway.errors import (
    AgentError,
    AuthError,
    ConfigError,
    EngineError,
    ExperimentInUseError,
    InfrastructureError,
    RequestError,
    RewardError,
    RolloutClosedError,
    RollwayError,
    StoredDataError,
    UnknownRolloutError,
)

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process a SIGTERM ended

_DEBUG = "ROLLWAY_DEBUG=1 shows the traceback"

#: Hints for each category of the error tree (every direct subclass of ``RollwayError``).
HINTS: dict[type[RollwayError], str] = {
    ConfigError: "`rollway COMMAND --help` lists the options",
    RequestError: f"the message names the field that was refused; {_DEBUG}",
    AuthError: "check the key (ROLLWAY_ADMIN_KEY for a gateway, ROLLWAY_AGENT_KEY for an agent)",
    UnknownRolloutError: f"the server no longer knows that rollout; {_DEBUG}",
    RolloutClosedError: f"that rollout was cancelled or already registered; {_DEBUG}",
    ExperimentInUseError: "one client per experiment: give this run another --exp-id, or stop "
    "the other client first",
    EngineError: "is the engine up and reachable? check --engine (or --gateway)",
    AgentError: "`rollway validate AGENT` lists what is wrong with the agent",
    RewardError: "fix the reward function (--reward)",
    StoredDataError: "the message names the file and what to do with it",
    InfrastructureError: f"a service did not answer; try again ({_DEBUG})",
}

#: Hints for a ``ConfigError`` about one input, named by its ``param``.
_INPUT_HINTS = {
    "agent": "fix the agent; `rollway validate AGENT` checks one without running it",
    "agent_key": "export ROLLWAY_AGENT_KEY=KEY where rollway runs (the agent server's key)",
    "reward": "--reward takes path/to/file.py:function or module:function",
    "model": "--model takes a local HF model folder (config.json, tokenizer, weights); "
    "docs/engines.md",
    "tasks": 'a task file holds one JSON object per line, such as {"prompt": "What is 2+2?"}',
    "ray_auth": "the cluster uses Ray's token authentication: set RAY_AUTH_MODE=token and its "
    "token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) where rollway runs; "
    "docs/ray.md#token-authentication",
    "ray_address": "check --ray-address (or RAY_ADDRESS) and that the cluster is up "
    "(`ray status`); docs/ray.md",
}

_OS_HINTS = {
    errno.ENOSPC: "the disk is full: free space there, or write elsewhere with --out",
    errno.EDQUOT: "the disk quota is used up: free space there, or write elsewhere with --out",
    errno.EROFS: "rollway cannot write there: give a writable results folder with --out",
    errno.EACCES: "rollway cannot write there: give a writable results folder with --out",
    errno.EPERM: "rollway cannot write there: give a writable results folder with --out",
}


@dataclass(frozen=True, slots=True)
class Failure:
    message: str
    hint: str


def explain(exc: BaseException) -> Failure:
    """What to tell the user about ``exc``."""
    if isinstance(exc, RollwayError):
        hint = _INPUT_HINTS.get(exc.param or "") if isinstance(exc, ConfigError) else None
        category = next(c for c in type(exc).__mro__ if c in HINTS or c is RollwayError)
        return Failure(str(exc), hint or HINTS.get(category, _DEBUG))
    if isinstance(exc, OSError) and exc.errno is not None:
        where = f": {exc.filename}" if exc.filename else ""
        return Failure(f"{exc.strerror}{where}", _OS_HINTS.get(exc.errno, _DEBUG))
    return Failure(
        f"unexpected {type(exc).__name__}: {exc}",
        "this may be a bug in rollway: rerun with ROLLWAY_DEBUG=1 and report the traceback",
    )


def fail(message: str, hint: str) -> NoReturn:
    """Print the failure and exit 1."""
    typer.secho(f"error: {message}", err=True, fg="red")
    typer.secho(f"hint: {hint}", err=True, dim=True)
    raise SystemExit(EXIT_FAILED)


def debugging() -> bool:
    return os.environ.get("ROLLWAY_DEBUG", "") not in ("", "0")


@contextmanager
def reported() -> Iterator[None]:
    """Turn an exception escaping a command into ``fail``; re-raise it when debugging."""
    try:
        yield
    except Exception as exc:
        if debugging():
            raise
        failure = explain(exc)
        fail(failure.message, failure.hint)
