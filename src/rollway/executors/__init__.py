"""Where rollouts run: in this process (``local``, the default) or on a Ray cluster (``ray``).
An executor takes one rollout at a time from the client and runs its life
(``rollway.rollouts``) there: placement, dispatch, re-dispatch of lost work, each worker's
gateway. What runs and when (batches, admission, resume) is the client's (``rollway.client``).
Ray is an optional extra, imported only when a ``RayExecutor`` starts."""

from __future__ import annotations

from rollway.errors import ConfigError
from rollway.executors.base import Executor, WorkerConfig
from rollway.executors.local_executor import LocalExecutor
from rollway.executors.ray_executor import RayExecutor

EXECUTORS = ("local", "ray")


def executor_from(executor: str | Executor) -> Executor:
    """``"local"``, ``"ray"`` (a ``RayExecutor`` with its defaults) or a ready executor."""
    if not isinstance(executor, str):
        return executor
    if executor == "local":
        return LocalExecutor()
    if executor == "ray":
        return RayExecutor()
    raise ConfigError(f"unknown executor {executor!r}: expected one of {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "RayExecutor", "WorkerConfig", "executor_from"]
