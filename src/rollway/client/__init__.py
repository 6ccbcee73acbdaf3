"""The rollout client: tasks in, one recorded outcome per rollout out."""

from rollway.client.batch import BatchItem, GroupStats, RunSummary
from rollway.client.future import RolloutFuture
from rollway.client.rollout_client import RolloutClient
from rollway.client.step_groups import StepBatch, StepMetrics
from rollway.client.step_source import StepSource

__all__ = [
    "BatchItem",
    "GroupStats",
    "RolloutClient",
    "RolloutFuture",
    "RunSummary",
    "StepBatch",
    "StepMetrics",
    "StepSource",
]
