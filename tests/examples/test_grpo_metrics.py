"""The GRPO loop's one-line step summary, on fixed metrics."""

from __future__ import annotations

from examples.grpo.metrics import step_line

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


def test_a_synchronous_step_line_shows_the_on_policy_mismatch() -> None:
    assert step_line(STEP) == (
        "step   3 v3 | reward 0.529 ± 0.250 | groups 8, set aside 2 flat 0 failed, 1 refilled, "
        "4 carried | on-policy max|ratio-1| 2.1e-05 |Δlogp| 3.4e-06 "
        "k3 1.2e-11 out 0% (80 tok) | rollout 2.0s train 4.5s sync 0.1s"
    )


def test_a_step_with_stale_tokens_shows_their_mismatch_apart() -> None:
    stale = {
        "stale_tokens": 50,
        "ratio_dev_stale": 0.31,
        "logprob_diff_mean_stale": 0.012,
        "k3_kl_stale": 1.5e-4,
        "ratio_outside_stale": 0.04,
    }
    assert (
        "| on-policy max|ratio-1| 2.1e-05 |Δlogp| 3.4e-06 k3 1.2e-11 out 0% (80 tok) "
        "| stale max|ratio-1| 3.1e-01 |Δlogp| 1.2e-02 k3 1.5e-04 out 4% (50 tok) |"
    ) in step_line(STEP | stale)
    # Asynchronous steps past the first: every token stale, and only they are shown.
    only_stale = STEP | stale | {"on_policy_tokens": 0}
    assert ", 4 carried | stale max|ratio-1| 3.1e-01 " in step_line(only_stale)
    assert "on-policy" not in step_line(only_stale)


def test_a_step_short_of_groups_says_how_many_it_lacks() -> None:
    assert "| groups 6 (lacking 2), set aside 10 flat" in step_line(
        STEP | {"groups_used": 6, "lacking": 2, "set_aside_flat": 10}
    )
