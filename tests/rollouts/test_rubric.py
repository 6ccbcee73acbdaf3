"""Rubrics: named reward functions with weights, each value kept as a component."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollway import ConfigError, Rubric
from rollway.client.fingerprint import fingerprint
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig
from rollway.rollouts.rewards import score
from rollway.trajectory import Trajectory
from tests.client.conftest import ScriptedAgent

TRAJECTORY = Trajectory(
    rollout_id="r", model="m", sampling={}, max_turns=None, max_seq_len=None, messages=[],
    tools=None, turns=[], is_truncated=False, truncation_reason=None, is_cancelled=False,
    segment_count=1, drift=None,
)  # fmt: skip


def answer(task: dict[str, Any], trajectory: Trajectory) -> float:
    return 1.0 if task["answer"] == 5 else 0.0


async def form(task: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"reward": 0.5, "tags": 2, "note": "one tag missing"}


def scored(reward: Any, task: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
    result = asyncio.run(score(reward, task, TRAJECTORY, limit_s=5.0))
    assert result.error is None, result.error
    return result.reward, result.info()


def test_the_reward_is_the_weighted_sum_and_each_value_a_component() -> None:
    rubric = Rubric({"answer": answer, "format": form}, weights={"format": 0.2})
    reward, info = scored(rubric, {"answer": 5})
    assert reward == pytest.approx(1.0 + 0.2 * 0.5)
    assert info == {"answer": 1.0, "format": 0.5, "format.tags": 2}
    info |= {"source": "reward_fn", "agent_reward": 1.0, "tries": [{"elapsed_s": 1}]}
    record = RolloutRecord(
        exp_id="e", rollout_key="k.0", rollout_id="e.k.0.1", task_index=0, group_id="e:k",
        group_index=0, sample_index=0, status="completed", reward=reward, reward_info=info,
        started_at=0.0, elapsed_s=0.0,
    )  # fmt: skip
    assert record.reward_components == {"answer": 1.0, "format": 0.5, "format.tags": 2.0}


def test_a_rubric_may_combine_its_components_otherwise() -> None:
    rubric = Rubric({"answer": answer, "format": form}, combine=lambda c: min(c.values()))
    assert scored(rubric, {"answer": 5})[0] == 0.5


def test_a_failing_function_fails_the_try_naming_it() -> None:
    def bad(task: dict[str, Any], trajectory: Trajectory) -> str:
        return "high"

    result = asyncio.run(score(Rubric({"bad": bad}), {}, TRAJECTORY, limit_s=5.0, retries=2))
    assert result.error == "rubric function 'bad': reward function returned str, not float or dict"
    assert len(result.tries) == 1  # a value that is no reward is not tried again


@pytest.mark.parametrize(
    ("functions", "weights", "named"),
    [
        ({}, None, "at least one function"),
        ({"source": answer}, None, "rubric function name 'source'"),
        ({"a.b": answer}, None, "rubric function name 'a.b'"),
        ({"answer": 1.0}, None, "'answer' is not callable"),
        ({"answer": answer}, {"other": 1.0}, "weight for 'other'"),
        ({"answer": answer}, {"answer": float("nan")}, "weight for 'answer' must be a finite"),
    ],
)
def test_a_bad_rubric_is_refused_naming_what(
    functions: dict[str, Any], weights: dict[str, float] | None, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        Rubric(functions, weights)


def test_the_fingerprint_names_a_rubrics_functions_and_weights() -> None:
    def prints(rubric: Rubric) -> Any:
        settings = RolloutConfig("e")
        made = fingerprint(
            agent=ScriptedAgent(), model="m", reward=rubric, settings=settings, policy_version=None
        )
        return made["reward"]

    one = prints(Rubric({"answer": answer}))
    assert one == "rubric(answer=tests.rollouts.test_rubric:answer*1)"
    assert prints(Rubric({"answer": answer}, {"answer": 2.0})) != one
