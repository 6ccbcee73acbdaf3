"""What each mode of ``python -m examples.grpo`` promises, over whole short runs (``run``) on
the embedded model: sync hands full batches sampled entirely by the step's weights even when
most groups are flat, and never a group carried from older weights when a batch is short;
every step prints its ratio check over the tokens it covered; the async run's summary accounts
for every step."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
from examples.grpo.config import GRPOConfig, describe_mode, max_extra_groups, source_staleness
from examples.grpo.loop import run
from examples.grpo.metrics import ratio_summary
from examples.grpo.tasks import QUESTIONS, TaskSet

from rollway.agents import AgentLoop, RolloutContext
from rollway.results import AgentResult


class MostlyFlatAgent(AgentLoop):
    """A ``flat`` task ends at once with reward 0 (its group is flat, no model call: it is set
    aside within milliseconds); any other is one turn rewarded by the reply's length and a
    share of its rollout id's hash, so its rewards differ within a group even when its replies
    are the same (a reply of at most the task's ``max_tokens``)."""

    name = "mostly-flat"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [{"role": "user", "content": ctx.task["question"]}]
        if ctx.task["flat"]:
            return ctx.complete(messages, "stop", reward=0.0)
        reply = await ctx.chat(messages, max_tokens=ctx.task["max_tokens"])
        reward = len(reply.content or "") / 40 + zlib.crc32(ctx.rollout_id.encode()) / 2**40
        return ctx.complete([*messages, reply.message], reply.finish_reason, reward=reward)


def task_set(kinds: str) -> TaskSet:
    """One task per letter of ``kinds`` (``f``: flat, ``i``: informative, ``s``: informative
    with a one-token reply, done long before an ``i``), cycled."""
    rows = tuple(
        {"task_id": f"q{i}", "question": QUESTIONS[i][0], "flat": kind == "f",
         "max_tokens": 1 if kind == "s" else 8}
        for i, kind in enumerate(kinds)
    )  # fmt: skip
    return TaskSet(MostlyFlatAgent, rows, max_tokens=8)


def config(tmp_path: Path, **changes: Any) -> GRPOConfig:
    small: dict[str, Any] = {
        "steps": 2,
        "prompts_per_step": 2,
        "group_size": 3,
        "max_tokens": 8,
        "lr": 1e-4,
    }
    return GRPOConfig(out_dir=tmp_path, plot=False, **(small | changes))


def assert_every_token_is_the_steps(steps: list[dict[str, Any]]) -> None:
    for m in steps:
        assert m["staleness"] == {"0": m["tokens"]} and m["stale_tokens"] == 0, m
        assert m["on_policy_tokens"] == m["tokens"] > 0 and m["carried_over"] == 0, m
        assert m["ratio_dev_on_policy"] < m["ratio_tol"], m


def assert_a_ratio_line_per_step(out: str, steps: list[dict[str, Any]]) -> None:
    for m in steps:
        line = next(x for x in out.splitlines() if x.startswith(f"step {m['step']:>3} "))
        assert f"ratio check over {m['on_policy_tokens']} on-policy tok: max|ratio-1| " in line


@pytest.mark.timeout(300)
def test_sync_hands_full_batches_of_the_steps_weights_when_most_groups_are_flat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three flat tasks before each informative one: a batch of 2 needs 6 groups set aside,
    # more than the step source's own cap (one batch's worth) lets a step replace.
    steps = run(config(tmp_path), task_set("fffi"))
    assert [m["step"] for m in steps] == [0, 1]
    assert [m["policy_version"] for m in steps] == [0, 1]
    for m in steps:
        assert m["groups_used"] == 2 and m["lacking"] == 0 and m["set_aside_flat"] >= 6, m
        assert m["informative_groups"] == 2 and m["rollouts"] == 6, m
    assert_every_token_is_the_steps(steps)
    out = capsys.readouterr().out
    assert out.startswith("sync: each step's batch is 2 groups x 3, sampled by the step's ")
    assert_a_ratio_line_per_step(out, steps)
    assert "off-policy" not in out.split("\n", 1)[1]


@pytest.mark.timeout(300)
def test_sync_never_hands_a_group_carried_from_older_weights_after_a_short_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No flat group may be replaced: once the flat one is set aside the batch of 3 cannot be
    # filled, and it is handed with the one-token group while the other still runs. That one
    # finishes under the old weights: it runs again under the new ones.
    steps = run(config(tmp_path, prompts_per_step=3, max_extra_groups=0), task_set("sfi"))
    assert all(m["lacking"] >= 1 for m in steps)
    assert steps[0]["carried_over"] >= 1
    for m in steps:
        assert m["staleness"] == {"0": m["tokens"]} and m["stale_tokens"] == 0, m
        assert m["on_policy_tokens"] == m["tokens"] > 0, m
    assert sum(m["restarted_stale"] for m in steps) >= 1
    out = capsys.readouterr().out
    assert "(lacking " in out
    assert_a_ratio_line_per_step(out, steps)


@pytest.mark.timeout(300)
def test_the_async_summary_accounts_for_every_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = run(config(tmp_path, async_rollouts=True), task_set("iiii"))
    out = capsys.readouterr().out
    assert out.startswith("async: each step's batch is 2 groups x 3, the first done of up to 3")
    on = [m for m in steps if m["on_policy_tokens"]]
    off = [m for m in steps if m["stale_tokens"]]
    assert steps[0] in on and off  # later batches sampled while the step before trained
    summary = ratio_summary(steps, 1e-3)
    assert f"over {sum(m['on_policy_tokens'] for m in on)} on-policy tokens of {len(on)} of 2 " in (
        summary
    )
    steps_off = f"{len(off)} step{'' if len(off) == 1 else 's'}"
    assert f"over {sum(m['stale_tokens'] for m in off)} tokens of {steps_off}" in summary
    for m in steps:
        line = next(x for x in out.splitlines() if x.startswith(f"step {m['step']:>3} "))
        if m["on_policy_tokens"]:
            assert f"ratio check over {m['on_policy_tokens']} on-policy tok: " in line
            assert m["ratio_dev_on_policy"] < m["ratio_tol"]
        else:
            assert "ratio check: no on-policy tok" in line
        if m["stale_tokens"]:
            assert f"| {m['stale_tokens']} off-policy tok (not checked): max|ratio-1| " in line


def test_each_mode_says_what_it_does_and_sets_the_source_so() -> None:
    sync, over, run_async = (
        GRPOConfig(),
        GRPOConfig(over_sample=0.5),
        GRPOConfig(async_rollouts=True, prompts_per_step=4),
    )
    assert (source_staleness(sync), max_extra_groups(sync)) == (0, 32)
    assert source_staleness(over) == source_staleness(run_async) == 1
    assert max_extra_groups(GRPOConfig(max_extra_groups=3)) == 3
    said = describe_mode(sync)
    assert said.startswith("sync: each step's batch is 8 groups x 4, sampled by the step's")
    assert "none is carried over" in said and "up to 32 a step" in said
    assert said.endswith("the ratio check covers every token")
    said = describe_mode(run_async)
    assert said.startswith("async: each step's batch is 4 groups x 4, the first done of up to 6")
    assert "one version behind (off-policy: importance-corrected" in said
    assert describe_mode(over).startswith("sync, over-sampled: each step's batch is 8 groups")
    assert "flat groups kept" in describe_mode(GRPOConfig(dynamic_sampling=False))
