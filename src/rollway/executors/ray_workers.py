"""The Ray executor's view of its worker actors: where they are placed (spread, or pinned per
node), their load, what their errors say, their restarts (waited for, then caught up on the last
weight update), and whether what they are sent pickles."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollway.errors import ConfigError, InfrastructureError
from rollway.retry import Backoff, RetryPolicy

if TYPE_CHECKING:
    from rollway.executors.base import WorkerConfig

#: A Ray worker being restarted, asked every half second whether it is ready, for two
#: minutes at most (the executor names Ray's errors and sets ``within_s``).
WORKER_RESTART = RetryPolicy(backoff=Backoff(first_s=0.5, factor=1.0), within_s=120.0)

log = logging.getLogger(__name__)

_EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt): ")


@dataclass
class RayWorker:
    index: int
    actor: Any
    in_flight: int = 0
    dispatched: int = 0
    up: bool = True
    #: The Ray node it was pinned to (``workers_per_node``); None: Ray spreads them.
    node: str | None = None
    #: Its rollouts sent in chunks (``ray_chunks.ChunkedCalls``), made when it starts.
    calls: Any = None


def worker_nodes(ray: Any, resources: dict[str, float], per_node: int) -> list[str]:
    """``per_node`` slots on each live node that can hold one worker (its CPUs, GPUs and
    custom resources), by node id: a head node started with no CPUs holds none."""
    slots = []
    for node in ray.nodes():
        have = node.get("Resources", {})
        fits = all(have.get(name, 0.0) >= need for name, need in resources.items() if need > 0)
        if node.get("Alive") and fits:
            slots += [node["NodeID"]] * per_node
    return slots


def pinned_to(ray: Any, node_id: str) -> Any:
    """Hard affinity: a worker whose node is lost is not restarted elsewhere (its rollouts are
    dispatched again to the workers left, and it is dropped once Ray gives up on it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


async def wait_for_restart(worker: RayWorker, errors: Any, timeout_s: float) -> bool:
    """True once Ray has restarted a lost worker within ``timeout_s``; ``errors``: Ray's
    ``ray.exceptions``."""
    restart = dataclasses.replace(
        WORKER_RESTART, within_s=timeout_s, retry_on=(errors.RayError, TimeoutError)
    )
    deadline = time.monotonic() + timeout_s
    restarted = False
    with contextlib.suppress(errors.RayError, TimeoutError):  # not back in time
        async for attempt in restart.retrying():
            with attempt:
                restarted = await _ready(worker, errors, deadline)
    return restarted


async def _ready(worker: RayWorker, errors: Any, deadline: float) -> bool:
    """True once a restarted worker answers; False when Ray is out of restarts for it."""
    ready = asyncio.wrap_future(worker.actor.ready.remote().future())
    try:
        await asyncio.wait_for(ready, max(0.1, deadline - time.monotonic()))
    except errors.ActorDiedError:
        return False
    return True


async def catch_up(worker: RayWorker, last_update: tuple[Any, int] | None) -> bool:
    """A restarted worker loads the last update (a ``NewWeights`` in Ray's object store, and
    its version) before it takes rollouts again."""
    if last_update is None:
        return True
    ref, version = last_update
    try:
        await asyncio.wrap_future(worker.actor.update_weights.remote(ref).future())
    except Exception as exc:
        log.error(
            "restarted Ray worker %d cannot load version %d: %s",
            worker.index,
            version,
            ray_cause(exc),
            extra={"stage": "worker_gone"},
        )
        return False
    return True


def ray_cause(exc: BaseException) -> str:
    """The line that says what went wrong: Ray wraps a worker's own exception in a traceback,
    whose last ``SomeError: ...`` line is the one to show."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    text = named[-1] if named else lines[0] if lines else type(exc).__name__
    return text[:500]


def task_error(exc: BaseException) -> Exception:
    """The error a worker raised, as itself when Ray kept it (a refused version stays a
    refused version), else an infrastructure error naming it."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else InfrastructureError(ray_cause(exc))


#: Modules that ``import_target`` loads from a file path: workers cannot import them by name,
#: so their agents and reward functions travel by value.
_FILE_MODULE_PREFIX = "rollway_agent_"


def check_shippable(setup: WorkerConfig, ray: Any) -> None:
    """Every part of the setup goes to every worker: say which one cannot, before starting."""
    engine = setup.engine
    if engine.in_process is not None:
        raise ConfigError(
            "executor='ray' builds each worker's gateway from an engine spec ('sim', "
            "'embedded', 'vllm://HOST:PORT', ...) or uses a shared RemoteGateway; "
            f"{engine.describe()} stays in one process"
        )
    for name in (type(setup.agent).__module__, getattr(setup.reward, "__module__", None)):
        if name and name.startswith(_FILE_MODULE_PREFIX) and name in sys.modules:
            ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    parts = {
        "agent": setup.agent,
        "reward function": setup.reward,
        "engine": engine,
        "store": setup.store,
        "settings": setup.settings,
    }
    for name, part in parts.items():
        try:
            ray.cloudpickle.loads(ray.cloudpickle.dumps(part))
        except Exception as exc:
            raise ConfigError(
                f"executor='ray' sends the {name} to every worker, but it does not pickle: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
