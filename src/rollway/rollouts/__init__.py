"""One rollout's life, wherever an executor puts it: register at the gateway, run the agent
under a timeout and a cancel signal, clean up, score, retry infrastructure failures, wait out
outages, store one record; with its settings, ids and record. Nothing here knows of batches
(``rollway.client``: what runs and when) or of processes and nodes (``rollway.executors``:
where it runs)."""

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
