"""``rollway view``: a local web app over a run folder (or object-storage experiment): a paged
listing of rollouts with their advantages, group statistics and reward by policy version, and
each rollout's group, whole conversation and token stream."""

from rollway.viewer.run_index import Query, RunIndex, RunLocation, open_run
from rollway.viewer.viewer_app import create_viewer_app

__all__ = ["Query", "RunIndex", "RunLocation", "create_viewer_app", "open_run"]
