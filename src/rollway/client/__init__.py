"""The rollout client: tasks in, one recorded outcome per rollout out."""

from rollway.client.batch import BatchItem, GroupStats, RunSummary
from rollway.client.client import RolloutClient
from rollway.client.future import RolloutFuture

__all__ = ["BatchItem", "GroupStats", "RolloutClient", "RolloutFuture", "RunSummary"]
