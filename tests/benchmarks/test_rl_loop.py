"""The short version of benchmarks/rl_loop.py: a run's figures come from its steps after step 0
(the ratio check's from every step), a real run of ``--async`` as it was before the step source
trains on every group with the ratio check passing, and bad modes are refused by name."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from benchmarks.rl_loop import config_for, figures, measure, parse


def step(step_s: float, tokens: int, stale: int, informative: int) -> dict[str, Any]:
    return {
        "rollout_s": 0.0, "train_s": step_s - 1, "sync_s": 1.0, "step_s": step_s,
        "tokens": tokens, "stale_tokens": stale, "on_policy_tokens": tokens - stale,
        "informative_groups": informative, "set_aside_flat": 0, "reward_mean": 0.5,
        "ratio_dev_on_policy": 2e-5 if stale < tokens else 0.0,
    }  # fmt: skip


def test_figures_leave_out_step_0_but_the_ratio_check_covers_it() -> None:
    steps = [step(30.0, 100, 0, 1), step(10.0, 60, 60, 2), step(20.0, 90, 90, 4)]
    found = figures(steps)
    assert found["steps_per_min"] == 4.0  # 2 steps in 30 s
    assert found["tokens_per_s"] == 5.0 and found["stale_share"] == 1.0
    assert found["informative"] == 3.0 and found["informative_per_min"] == 12.0
    assert found["ratio_dev"] == 2e-5 and found["on_policy_tokens"] == 100


def test_the_old_async_mode_is_the_step_source_without_extra_groups_or_dynamic_sampling() -> None:
    args = parse(["--modes", "async-old", "async"])
    old, new = (config_for(mode, args, Path("out")) for mode in args.modes)
    assert old.async_rollouts and old.over_sample == 0.0 and not old.dynamic_sampling
    assert new.async_rollouts and new.over_sample is None and new.dynamic_sampling
    assert (old.steps, old.prompts_per_step, old.group_size) == (5, 8, 4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--modes", "async", "async"], "names async twice"), (["--steps", "1"], "at least 2"),
     (["--modes", "sync", "fast"], "invalid choice: 'fast'")],
)  # fmt: skip
def test_bad_arguments_are_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(argv)
    assert message in capsys.readouterr().err


@pytest.mark.timeout(600)  # ~40 s on an idle machine; minutes at load 20
def test_a_short_run_of_the_old_async_keeps_every_group_and_passes_the_ratio_check() -> None:
    # No dynamic sampling: a flat group is trained on, never set aside (a 2 x 2 run with it
    # could find every group flat up to its cap and stop).
    args = parse(["--modes", "async-old", "async", "--steps", "2", "--prompts", "2",
                  "--group-size", "2"])  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        found = measure("async-old", args, Path(tmp))
    assert found["steps_per_min"] > 0 and found["tokens_per_s"] > 0 and found["set_aside"] == 0
    assert 0 <= found["informative"] <= 2 and 0 <= found["stale_share"] <= 1
    assert found["on_policy_tokens"] > 0 and found["ratio_dev"] <= 1e-3
