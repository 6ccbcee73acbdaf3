"""One sample per conversation thread: a request extends the tip of whichever thread it
continues, not only the last answered one, so a subagent or side call running between two
turns of the main conversation leaves the main conversation one exact sample (and is one of
its own)."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.trajectory import Trajectory
from rollway.trajectory_format import whole_prompts
from tests.conftest import sim_gateway

MAIN = [
    {"role": "system", "content": "You are the main agent."},
    {"role": "user", "content": "Fix the bug."},
]
SUB = [
    {"role": "system", "content": "You are a search subagent."},
    {"role": "user", "content": "Find foo."},
]


async def turn(
    gateway: Gateway, rollout_id: str, messages: list[dict[str, Any]], more: str
) -> None:
    """One call of a thread: ask, keep the answer, add the next user message."""
    result = await gateway.chat(rollout_id, {"messages": messages, "max_tokens": 6})
    messages += [result.message, {"role": "user", "content": more}]


def assert_each_thread_one_exact_sample(trajectory: Trajectory, threads: int) -> None:
    assert trajectory.segment_count == threads
    samples = trajectory.samples
    assert len(samples) == threads
    chains = list(whole_prompts(trajectory.turns))
    for sample in samples:
        own = [(turn, prompt) for turn, prompt in chains if turn.segment == sample.segment]
        for (before, prompt), (_, after) in pairwise(own):
            assert (
                after[: len(prompt) + len(before.completion_ids)] == prompt + before.completion_ids
            )
        sampled = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
        assert sampled == [t for turn, _ in own for t in turn.completion_ids]
        logprobs = [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m]
        assert logprobs == [lp for turn, _ in own for lp in turn.logprobs]
        last, prompt = own[-1]
        assert sample.prompt_ids + sample.response_ids == prompt + last.completion_ids


async def test_a_subagent_between_main_turns_leaves_two_samples(renderer: ChatRenderer) -> None:
    gateway = sim_gateway(renderer)
    gateway.register("threads", {"temperature": 1.0, "seed": 3})
    main, sub = [dict(m) for m in MAIN], [dict(m) for m in SUB]
    for n in range(3):
        await turn(gateway, "threads", main, f"main step {n}")
        await turn(gateway, "threads", sub, f"sub step {n}")
    await turn(gateway, "threads", main, "done?")
    trajectory = await gateway.trajectory("threads")
    assert [t.segment for t in trajectory.turns] == [0, 1, 0, 1, 0, 1, 0]
    assert_each_thread_one_exact_sample(trajectory, threads=2)
    assert trajectory.conversations == 2
    # The trajectory's messages (and its drift figure) are the last answered thread's.
    assert trajectory.messages[:2] == MAIN and trajectory.messages[-1]["role"] == "assistant"


async def test_concurrent_threads_each_stay_one_sample(renderer: ChatRenderer) -> None:
    gateway = sim_gateway(renderer)
    gateway.register("concurrent", {"temperature": 1.0, "seed": 5})
    threads = [[dict(MAIN[0]), {"role": "user", "content": f"Task part {n}."}] for n in range(3)]

    async def run(messages: list[dict[str, Any]]) -> None:
        for n in range(4):
            await turn(gateway, "concurrent", messages, f"go on {n}")

    await asyncio.gather(*(run(messages) for messages in threads))
    trajectory = await gateway.trajectory("concurrent")
    assert_each_thread_one_exact_sample(trajectory, threads=3)


async def test_a_thread_edited_past_its_tip_still_starts_a_segment(renderer: ChatRenderer) -> None:
    gateway = sim_gateway(renderer)
    gateway.register("edited", {"temperature": 1.0, "seed": 7})
    main, sub = [dict(m) for m in MAIN], [dict(m) for m in SUB]
    await turn(gateway, "edited", main, "next")
    await turn(gateway, "edited", sub, "next")
    main[2] = {"role": "assistant", "content": "an answer the model never gave"}
    await turn(gateway, "edited", main, "after the edit")
    trajectory = await gateway.trajectory("edited")
    assert [t.segment for t in trajectory.turns] == [0, 1, 2]
    assert_each_thread_one_exact_sample(trajectory, threads=3)
