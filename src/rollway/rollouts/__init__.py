"""One rollout, run where an executor puts it: register at the gateway, run the agent under a
timeout and a cancel signal, score, retry infrastructure failures, store one record."""

from rollway.rollouts.config import (
    RolloutConfig,
    RolloutLimits,
    RolloutOptions,
    ServingConfig,
)
from rollway.rollouts.judge import Judge, parse_score
from rollway.rollouts.records import make_record
from rollway.rollouts.rewards import RewardFn, score
from rollway.rollouts.rubric import Rubric
from rollway.rollouts.runner import RolloutRunner
from rollway.rollouts.spec import RolloutSpec, attempt_id, task_key

__all__ = [
    "Judge",
    "RewardFn",
    "RolloutConfig",
    "RolloutLimits",
    "RolloutOptions",
    "RolloutRunner",
    "RolloutSpec",
    "Rubric",
    "ServingConfig",
    "attempt_id",
    "make_record",
    "parse_score",
    "score",
    "task_key",
]
