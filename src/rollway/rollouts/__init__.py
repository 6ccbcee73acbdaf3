"""One rollout, run where an executor puts it: register at the gateway, run the agent under a
timeout and a cancel signal, score, retry infrastructure failures, store one record."""

from rollway.rollouts.config import (
    RolloutLimits,
    RolloutOptions,
    RolloutSettings,
    ServingConfig,
)
from rollway.rollouts.loop_thread import LoopThread
from rollway.rollouts.records import make_record
from rollway.rollouts.rewards import RewardFn, score
from rollway.rollouts.runner import RolloutRunner
from rollway.rollouts.spec import RolloutSpec, attempt_id, task_key

__all__ = [
    "LoopThread",
    "RewardFn",
    "RolloutLimits",
    "RolloutOptions",
    "RolloutRunner",
    "RolloutSettings",
    "RolloutSpec",
    "ServingConfig",
    "attempt_id",
    "make_record",
    "score",
    "task_key",
]
