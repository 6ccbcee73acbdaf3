"""The GRPO loop's one-line step summary and its reward components, on fixed metrics."""

from __future__ import annotations

import asyncio
import math

from examples.grpo.loop import component_means
from examples.grpo.metrics import plot_components, ratio_summary, step_line
from examples.grpo.tasks import ONE_WORD_RUBRIC, load_task_set, one_word_reward

from rollway.results import RolloutRecord
from rollway.trajectory import Trajectory
from tests.viewer.test_listing_scale import small_record
from tests.viewer.test_token_view import trajectory

STEP = {
    "step": 3,
    "policy_version": 3,
    "reward_mean": 0.5291,
    "reward_std": 0.25,
    "on_policy_tokens": 80,
    "ratio_dev_on_policy": 2.1e-5,
    "logprob_diff_mean_on_policy": 3.4e-6,
    "k3_kl_on_policy": 1.24e-11,
    "ratio_outside_on_policy": 0.0,
    "stale_tokens": 0,
    "ratio_dev_stale": 0.0,
    "logprob_diff_mean_stale": 0.0,
    "k3_kl_stale": 0.0,
    "ratio_outside_stale": 0.0,
    "rollout_s": 2.04,
    "train_s": 4.51,
    "sync_s": 0.12,
    "groups_used": 8,
    "lacking": 0,
    "set_aside_flat": 2,
    "set_aside_failed": 0,
    "refilled": {"engine": 1},
    "carried_over": 4,
}


def test_a_synchronous_step_line_shows_the_ratio_check_over_its_on_policy_tokens() -> None:
    assert step_line(STEP) == (
        "step   3 v3 | reward 0.529 ± 0.250 | groups 8, set aside 2 flat 0 failed, 1 refilled, "
        "4 carried | ratio check over 80 on-policy tok: max|ratio-1| 2.1e-05 |Δlogp| 3.4e-06 "
        "k3 1.2e-11 out 0% | rollout 2.0s train 4.5s sync 0.1s"
    )


STALE = {
    "stale_tokens": 50,
    "ratio_dev_stale": 0.31,
    "logprob_diff_mean_stale": 0.012,
    "k3_kl_stale": 1.5e-4,
    "ratio_outside_stale": 0.04,
}


def test_a_step_with_off_policy_tokens_shows_their_mismatch_apart_unchecked() -> None:
    assert (
        "| ratio check over 80 on-policy tok: max|ratio-1| 2.1e-05 |Δlogp| 3.4e-06 k3 1.2e-11 "
        "out 0% | 50 off-policy tok (not checked): max|ratio-1| 3.1e-01 |Δlogp| 1.2e-02 "
        "k3 1.5e-04 out 4% |"
    ) in step_line(STEP | STALE)
    # Asynchronous steps past the first: every token off-policy, and the line says the check
    # covered none.
    only_stale = STEP | STALE | {"on_policy_tokens": 0}
    assert (
        ", 4 carried | ratio check: no on-policy tok | 50 off-policy tok (not checked): "
        "max|ratio-1| 3.1e-01 "
    ) in step_line(only_stale)


def test_the_run_summary_says_which_steps_and_tokens_the_ratio_check_covered() -> None:
    # Async on 2 cores: step 0 on-policy, steps 1-3 off-policy, step 4 a mix.
    steps = [
        STEP | {"step": 0},
        *(STEP | STALE | {"step": s, "on_policy_tokens": 0, "ratio_dev_on_policy": 0.0}
          for s in (1, 2, 3)),
        STEP | STALE | {"step": 4, "ratio_dev_on_policy": 3e-5, "ratio_dev_stale": 1.4},
    ]  # fmt: skip
    assert ratio_summary(steps, 1e-3) == (
        "ratio check: max |ratio-1| 3.0e-05 over 160 on-policy tokens of 2 of 5 steps "
        "(tolerance 0.001), none in steps 1-3; off-policy (not checked): max |ratio-1| 1.4e+00 "
        "over 200 tokens of 4 steps"
    )
    assert ratio_summary([STEP, STEP | {"step": 4}], 1e-3) == (
        "ratio check: max |ratio-1| 2.1e-05 over 160 on-policy tokens of 2 of 2 steps "
        "(tolerance 0.001); no off-policy token"
    )
    assert ratio_summary(steps[1:2], 1e-3).startswith("ratio check: no on-policy token in 1 step;")


def test_a_step_short_of_groups_says_how_many_it_lacks() -> None:
    assert "| groups 6 (lacking 2), set aside 10 flat" in step_line(
        STEP | {"groups_used": 6, "lacking": 2, "set_aside_flat": 10}
    )


def test_a_step_line_shows_the_rewards_components_when_it_has_some() -> None:
    components = {"reward_components": {"form": 0.4121, "truth": 0.25}}
    assert "| reward 0.529 ± 0.250 (form 0.412, truth 0.250) | groups 8" in step_line(
        STEP | components
    )
    assert "reward 0.529 ± 0.250 | groups" in step_line(STEP | {"reward_components": {}})


def test_the_plot_draws_each_components_mean_beside_the_reward() -> None:
    import matplotlib  # the ``rl`` extra's, and the ``dev`` one's so this test always runs

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [
        {"step": 0, "reward_components": {"form": 0.2, "truth": 0.1}},
        {"step": 1, "reward_components": {"form": 0.5}},
    ]
    fig, (with_components, without) = plt.subplots(1, 2)
    plot_components(steps, with_components)
    plot_components([{"step": 0}, {"step": 1, "reward_components": {}}], without)
    lines = {line.get_label(): list(line.get_ydata()) for line in with_components.get_lines()}
    plt.close(fig)
    assert lines["reward/form (mean)"] == [0.2, 0.5]
    assert lines["reward/truth (mean)"][0] == 0.1 and math.isnan(lines["reward/truth (mean)"][1])
    assert without.get_lines() == []


def test_the_one_word_rubric_is_the_one_word_reward_in_two_components() -> None:
    answers = frozenset({"paris"})
    for text, finish in (("Paris", "stop"), ("It is Paris.", "stop"), ("Rome", "stop"),
                         ("", "stop"), ("Paris Paris", "length")):  # fmt: skip
        trajectory = one_turn(text, finish)
        scored = asyncio.run(ONE_WORD_RUBRIC({"answers": ["paris"]}, trajectory))
        assert scored["reward"] == one_word_reward(text, finish, answers)
        assert set(scored) == {"reward", "form", "truth"}
    scored = asyncio.run(ONE_WORD_RUBRIC({"answers": ["paris"]}, one_turn("It is Paris.", "stop")))
    assert (scored["form"], scored["truth"]) == (1 / 3, 1.0)
    assert load_task_set("one-word").reward is ONE_WORD_RUBRIC


def test_a_steps_component_means_are_over_the_records_that_have_each() -> None:
    def record(i: int, info: dict[str, float]) -> RolloutRecord:
        return small_record(i).model_copy(update={"reward": 1.0, "reward_info": info})

    records = [record(1, {"form": 1.0, "truth": 0.0}), record(2, {"form": 0.5}), record(3, {})]
    assert component_means(records) == {"form": 0.75, "truth": 0.0}
    assert component_means([record(3, {})]) == {}


def one_turn(text: str, finish_reason: str) -> Trajectory:
    base = trajectory(None)
    last = base.turns[0].model_copy(update={"content": text, "finish_reason": finish_reason})
    return base.model_copy(update={"turns": [last]})
