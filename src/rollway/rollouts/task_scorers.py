"""A task that names its own scorer: a row from a task source with a verifier (reasoning-gym)
carries ``"scorer": {"kind": ..., ...}``, and a rollout whose client was given no reward is
scored by it. Only the kinds in ``TASK_SCORERS`` are known: a task file names a scorer, it
never names code to import."""

from __future__ import annotations

from typing import Any

from rollway.errors import RewardError
from rollway.rollouts.reasoning_gym_scorer import KIND as REASONING_GYM
from rollway.rollouts.reasoning_gym_scorer import score_reasoning_gym
from rollway.rollouts.rewards import RewardFn
from rollway.trajectory import Trajectory

#: The task field that names the scorer.
SCORER_FIELD = "scorer"
#: Each kind of scorer a task may name, by its kind.
TASK_SCORERS: dict[str, RewardFn] = {REASONING_GYM: score_reasoning_gym}


def task_scorer(task: dict[str, Any]) -> RewardFn | None:
    """The scorer ``task`` names, None when it names none; a task naming an unknown kind gets
    one that says so (its rollout's reward fails with that reason)."""
    named = task.get(SCORER_FIELD)
    if named is None:
        return None
    kind = named.get("kind") if isinstance(named, dict) else None
    scorer = TASK_SCORERS.get(kind) if isinstance(kind, str) else None
    return scorer if scorer is not None else _unknown_scorer


def _unknown_scorer(task: dict[str, Any], trajectory: Trajectory) -> float:
    known = ", ".join(sorted(TASK_SCORERS))
    raise RewardError(
        f"the task's {SCORER_FIELD!r} ({task.get(SCORER_FIELD)!r:.80}) names no known scorer: "
        f"a scorer is {{'kind': one of {known}, ...}}"
    )
