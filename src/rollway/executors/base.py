"""The executor seam: where a client's rollouts run. The client keeps the batch, the futures,
the concurrency cap and the rate limit; an executor runs one rollout at a time on request,
in this process (``LocalExecutor``) or on a Ray cluster's workers (``RayExecutor``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollway.agents.base import AgentLoop
from rollway.events import EventBus
from rollway.gateway.engine_choice import EngineChoice
from rollway.gateway.weight_control import NewWeights, PolicyState, WeightUpdate
from rollway.loop_thread import LoopThread
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutSpec, ServingConfig
from rollway.rollouts.rewards import RewardFn
from rollway.store.base import Store


@dataclass(frozen=True)
class WorkerConfig:
    """Everything needed to run a client's rollouts somewhere: what the client was given, its
    engine argument sorted once (``EngineChoice``). For Ray it is pickled to every worker, so
    the engine is a spec or a shared gateway there, not an object holding a model; the
    client's event bus is no part of it (``Executor.start`` takes it)."""

    agent: AgentLoop
    engine: EngineChoice
    store: Store
    settings: RolloutConfig
    reward: RewardFn | None = None
    serving: ServingConfig = field(default_factory=ServingConfig)
    #: Trace the rollouts (``rollway.tracing``): a Ray worker turns tracing on in its process.
    trace: bool = False


class Executor(Protocol):
    #: The model the rollouts sample from, once started.
    model_name: str
    #: Records come back without their trajectories (those are in the store).
    light_records: bool

    def start(self, setup: WorkerConfig, loop: LoopThread, events: EventBus) -> None:
        """Get ready to run rollouts (called once, on the caller's thread); errors in the
        setup surface here, before any rollout. ``events``: where the rollouts and turns that
        run in this process are heard (the client's bus; not shipped with ``setup``)."""
        ...

    async def run(
        self, spec: RolloutSpec, settings: RolloutConfig, cancel: asyncio.Event
    ) -> RolloutRecord:
        """Run one rollout to its one recorded outcome (written to the store). Never raises
        for the rollout's own failures: they are the record's status."""
        ...

    async def update_weights(self, new: NewWeights) -> WeightUpdate:
        """Give every engine the rollouts sample from the new weights (pause in ``new.mode``,
        load, resume); what the update did comes back."""
        ...

    async def policy(self) -> PolicyState:
        """The engines' policy version (None: no versions), pause state and pause modes."""
        ...

    def close(self, loop: LoopThread) -> None:
        """Release what ``start`` took (engines, servers, workers); nothing is running."""
        ...

    def describe(self) -> dict[str, Any]:
        """What goes into the run's config: which executor, how many workers."""
        ...
