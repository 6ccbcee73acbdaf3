"""What an RL researcher asks of a run, from its listing rows: which rewards count (scored),
the reward and completion rate per policy version, and each rollout's GRPO advantage in its
group."""

from __future__ import annotations

import math
from typing import Any

from rollway.errors import TRANSIENT_KINDS

Row = dict[str, Any]
#: Statuses that count as completed: the rollout ran to its end (a gateway limit included).
SUCCESS = frozenset({"completed", "truncated"})


def is_scored(row: Row) -> bool:
    """A reward that counts: there is one, and no infrastructure or engine failure made it
    (those are left out of means, as ``groups.json`` does)."""
    return row["reward"] is not None and row["error_kind"] not in TRANSIENT_KINDS


def scored_rewards(rows: list[Row]) -> list[float]:
    return [row["reward"] for row in rows if is_scored(row)]


def mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def version_stats(rows: list[Row]) -> list[Row]:
    """Per policy version (the oldest that sampled each rollout), oldest first, rollouts
    without versioned tokens last (version None): rollouts, scored ones, their mean reward,
    and the completion rate over all."""
    by_version: dict[int | None, list[Row]] = {}
    for row in rows:
        by_version.setdefault(row.get("policy_version"), []).append(row)
    order = sorted(by_version, key=lambda v: (v is None, v if v is not None else 0))
    return [_version_row(version, by_version[version]) for version in order]


def _version_row(version: int | None, rows: list[Row]) -> Row:
    rewards = scored_rewards(rows)
    return {
        "policy_version": version,
        "n": len(rows),
        "scored": len(rewards),
        "mean_reward": mean(rewards),
        "success_rate": sum(row["status"] in SUCCESS for row in rows) / len(rows),
    }


def advantage(row: Row, group: Row) -> float | None:
    """GRPO's advantage of ``row`` in ``group`` (a row of the groups table): (reward - mean) /
    std over the group's scored rewards, with the population std the table shows; 0 in a flat
    group (no reward spread: no signal); None where the reward does not count."""
    if not is_scored(row):
        return None
    if group["flat"] or not group["std_reward"]:
        return 0.0
    return float((row["reward"] - group["mean_reward"]) / group["std_reward"])


def advantages(rows: list[Row], groups: list[Row]) -> dict[str, float | None]:
    """Each rollout's advantage, by key."""
    by_id = {group["group_id"]: group for group in groups}
    return {row["key"]: advantage(row, by_id[row["group_id"]]) for row in rows}
