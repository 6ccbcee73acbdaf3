"""The rollout client: what runs and when. Tasks in, one recorded outcome per rollout out:
batches and groups, resume, admission (concurrency, rate, starts held during updates,
staleness), the experiment's lease, weight updates, events and progress, rescoring, and the
trainers' step sources. It never runs a rollout itself: where one runs is ``rollway.executors``,
one rollout's life is ``rollway.rollouts`` (docs/architecture.md, "who owns what")."""

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
