"""Judges: reward functions that ask a model through a rollway gateway, their calls recorded in
the reward info and never in the policy's trajectory."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollway import ConfigError, Gateway, Judge, JudgeAnswerError, RolloutClient, Rubric
from rollway.engines.embedded import EmbeddedEngine
from rollway.rollouts.judge import judging, parse_score
from rollway.rollouts.rewards import score
from rollway.trajectory import Trajectory
from tests.client.conftest import ScriptedAgent
from tests.client.test_rescore import MakeClient
from tests.rollouts.test_rubric import TRAJECTORY


def some_answer(answer: str) -> float:
    """A parser for the simulated engine, whose answers are token soup."""
    return 1.0 if answer else 0.0


def test_a_judge_asks_the_policys_engine_apart_from_the_policys_turns(
    make_client: MakeClient,
) -> None:
    client = make_client(reward=Judge("Grade {q}: {answer}", parse=some_answer))
    (item,) = client.run_batch([{"task_id": "t", "q": "two plus two", "chats": 2}])
    record = item.result
    assert record.status in ("completed", "truncated") and record.reward == 1.0
    (call,) = record.reward_info["judge_calls"]
    assert call["rollout_id"] == f"{record.rollout_id}.judge-1"
    assert call["name"] == "judge" and call["score"] == 1.0 and call["latency_s"] >= 0
    policy_answer = record.trajectory.turns[-1].content
    assert call["prompt"] == [{"role": "user", "content": f"Grade two plus two: {policy_answer}"}]
    assert call["answer"] and "error" not in call
    # The judge's call is no turn, sample or model call of the rollout.
    assert len(record.trajectory.turns) == 2 and record.metrics.llm_calls == 2
    assert len(record.trajectory.samples) == 1
    assert all(turn.content != call["answer"] for turn in record.trajectory.turns)
    assert record.reward_components == {}  # the calls are rollway's, not a component
    # Unregistered once it answered: the gateway holds no judge rollout.
    assert not [r for r in client.gateway.gateway._rollouts if ".judge-" in r]  # type: ignore[attr-defined]


def test_a_judge_in_a_rubric_is_one_component_its_calls_kept_beside(
    make_client: MakeClient,
) -> None:
    def turns(task: dict[str, Any], trajectory: Trajectory) -> float:
        return float(len(trajectory.turns))

    judge = Judge(parse=some_answer, sampling={"max_tokens": 4, "seed": 7}, name="grader")
    rubric = Rubric({"judge": judge, "turns": turns}, weights={"turns": 0.5})
    (item,) = make_client(reward=rubric).run_batch([{"task_id": "t"}])
    info = item.result.reward_info
    assert item.result.reward == 1.5 and item.result.reward_components == {
        "judge": 1.0,
        "turns": 1.0,
    }
    (call,) = info["judge_calls"]
    assert call["name"] == "grader" and call["prompt"][0]["content"].startswith("Grade the answer")


def test_an_answer_without_a_score_is_asked_again_then_an_error_quoting_it(
    make_client: MakeClient,
) -> None:
    client = make_client(reward=Judge(), reward_retries=1)  # the default parser: "Score: N"
    (item,) = client.run_batch([{"task_id": "t"}])
    record = item.result
    assert (record.status, record.error_kind) == ("error", "reward")
    assert record.reason.startswith("judge answer has no 'Score: N': '")
    assert record.reason.endswith("(2 tries)") and record.trajectory is not None
    calls = record.reward_info["judge_calls"]
    assert [c["rollout_id"].rsplit(".", 1)[-1] for c in calls] == ["judge-1", "judge-2"]
    assert all(c["error"].startswith("judge answer has no") and c["answer"] for c in calls)
    assert len(record.reward_info["tries"]) == 2


def test_a_judge_with_its_own_engine_and_through_a_rescore(make_client: MakeClient) -> None:
    judge = Judge("{answer}", parse=some_answer, engine="sim")
    client = make_client(reward=judge, exp_id="own")
    (item,) = client.run_batch([{"task_id": "t"}])
    (call,) = item.result.reward_info["judge_calls"]
    assert call["score"] == 1.0 and judge._own is not None
    assert judge._own is not client.gateway
    report = client.rescore(Judge("again {answer}", parse=lambda answer: 0.5))
    assert report.scored == 1
    (record,) = client.store.records()
    assert record.reward == 0.5
    (call,) = record.reward_info["judge_calls"]
    assert call["prompt"][0]["content"].startswith("again ") and call["score"] == 0.5
    asyncio.run(judge.aclose())


def test_a_prompt_reads_the_task_whole_or_by_field() -> None:
    judge = Judge("{task} | {q} | {task[answer]} | {answer}")
    (message,) = judge.messages({"q": "2+2", "answer": 4}, TRAJECTORY)
    assert message["content"] == '{"q": "2+2", "answer": 4} | 2+2 | 4 | '


def test_a_prompt_field_that_is_not_there_fails_once_naming_it() -> None:
    judge = Judge("Grade {question}", engine="sim")
    result = asyncio.run(score(judge, {"q": 1}, TRAJECTORY, limit_s=5.0, retries=2))
    assert result.error is not None and "judge prompt field {question}" in result.error
    assert len(result.tries) == 1


def test_a_judge_of_the_policys_engine_needs_a_client() -> None:
    result = asyncio.run(score(Judge(), {}, TRAJECTORY, limit_s=5.0))
    assert result.error is not None and "Judge(engine='embedded')" in result.error


def test_parse_score_reads_the_last_score_and_names_a_bad_answer() -> None:
    assert parse_score("Score: 3. On reflection, score = 7") == pytest.approx(0.7)
    assert parse_score("SCORE 4", low=1, high=5) == pytest.approx(0.75)
    with pytest.raises(JudgeAnswerError, match=r"outside 0\.\.10: 'Score: 12'"):
        parse_score("Score: 12")
    with pytest.raises(JudgeAnswerError, match=r"no 'Score: N': 'x{120}\.\.\.'"):
        parse_score("x" * 500)


def test_bad_judge_sampling_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="Judge sampling"):
        Judge(sampling={"temperature": 9.0})


def test_a_judge_on_the_embedded_model(
    engine: EmbeddedEngine, gateway: Gateway, tmp_path: Any
) -> None:
    judge = Judge("Is 2+2=4? {answer}", parse=some_answer, sampling={"max_tokens": 8})
    # A generous limit per try: on a loaded CPU even 8 tokens can take a while.
    limits = {"reward_timeout": 300.0}
    store = str(tmp_path / "runs")
    with RolloutClient(
        ScriptedAgent, gateway, reward=judge, store=store, limits=limits, max_tokens=8
    ) as client:
        (item,) = client.run_batch([{"task_id": "t", "q": "What is 2+2?"}])
    (call,) = item.result.reward_info["judge_calls"]
    assert call["answer"] and call["score"] == 1.0 and "tries" not in item.result.reward_info
    assert len(item.result.trajectory.turns) == 1
    assert call["prompt"][0]["content"] == f"Is 2+2=4? {item.result.trajectory.turns[0].content}"


def unreadable(answer: str) -> float:
    raise JudgeAnswerError(f"no score in {answer!r}")


def test_a_greedy_judge_asks_again_with_what_can_change() -> None:
    judge = Judge("Grade: {answer}", parse=unreadable, engine="sim")
    with judging(None, "r") as calls:
        result = asyncio.run(score(judge, {}, TRAJECTORY, limit_s=60.0, retries=2))
    assert result.error is not None and result.error.endswith("(3 tries)")
    assert "sampling" not in calls[0]  # the first ask is the judge's own: greedy
    assert [c.get("sampling") for c in calls[1:]] == [
        {"temperature": 0.7, "seed": 1},
        {"temperature": 0.7, "seed": 2},
    ]
    assert len({c["answer"] for c in calls}) == 3  # each ask could answer otherwise
    asyncio.run(judge.aclose())


def test_a_greedy_judge_that_may_not_change_fails_at_once_saying_why() -> None:
    judge = Judge("Grade: {answer}", parse=unreadable, engine="sim", retry_temperature=None)
    with judging(None, "r") as calls:
        result = asyncio.run(score(judge, {}, TRAJECTORY, limit_s=60.0, retries=2))
    assert len(calls) == 1 and len(result.tries) == 1
    assert result.error is not None and "not asked again: at temperature 0" in result.error
    asyncio.run(judge.aclose())
