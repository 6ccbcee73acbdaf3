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
from rollway.gateway.rollout_state import SequenceHashes
from rollway.trajectory import Trajectory
from rollway.trajectory_format import check_prompt_hashes, whole_prompts
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
    samples = trajectory.all_samples  # a thread without tools may be a side call
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


TOOL = {
    "type": "function",
    "function": {"name": "bash", "description": "Run a command.", "parameters": {"type": "object"}},
}
TITLE = [
    {"role": "system", "content": "Write a five-word title for the conversation."},
    {"role": "user", "content": "Fix the bug."},
]


async def harness_with_a_title_call(renderer: ChatRenderer, **registration: Any) -> Trajectory:
    """A harness's run: its title call first (no tools, its own system prompt), then its main
    conversation (tools offered) with a subagent (tools offered) between two turns."""
    gateway = sim_gateway(renderer)
    gateway.register("harness", {"temperature": 1.0, "seed": 11, **registration})
    main, sub = [dict(m) for m in MAIN], [dict(m) for m in SUB]
    await gateway.chat("harness", {"messages": [dict(m) for m in TITLE], "max_tokens": 6})
    for messages, more in ((main, "go on"), (sub, "report"), (main, "finish")):
        result = await gateway.chat(
            "harness", {"messages": messages, "tools": [TOOL], "max_tokens": 6}
        )
        messages += [result.message, {"role": "user", "content": more}]
    return await gateway.trajectory("harness")


async def test_a_side_call_is_labelled_and_left_out_of_the_training_samples(
    renderer: ChatRenderer,
) -> None:
    trajectory = await harness_with_a_title_call(renderer)
    assert [t.segment for t in trajectory.turns] == [0, 1, 2, 1]
    assert trajectory.side_calls == [0]
    assert [(s.segment, s.side_call) for s in trajectory.all_samples] == [
        (0, True),
        (1, False),
        (2, False),
    ]
    assert [s.segment for s in trajectory.samples] == [1, 2]  # the main thread, the subagent
    assert trajectory.conversations == 2  # the title call asks about the same first message


async def test_side_calls_are_trained_when_the_rollout_asks(renderer: ChatRenderer) -> None:
    trajectory = await harness_with_a_title_call(renderer, side_calls="train")
    assert trajectory.side_calls == []
    assert [s.segment for s in trajectory.samples] == [0, 1, 2]


async def test_folds_of_a_no_tools_agent_are_no_side_calls(renderer: ChatRenderer) -> None:
    """A fold that keeps the system prompt, and one that starts afresh from a user message (as
    a hand-written agent may fold), stay training samples."""
    gateway = sim_gateway(renderer)
    gateway.register("plain", {"temperature": 1.0, "seed": 13})
    main = [dict(m) for m in MAIN]
    await turn(gateway, "plain", main, "more")
    folded = [dict(MAIN[0]), {"role": "user", "content": "Summary so far: nothing. Go on."}]
    await turn(gateway, "plain", folded, "more")
    afresh = [{"role": "user", "content": "Summarise the task so far."}]
    await turn(gateway, "plain", afresh, "more")
    trajectory = await gateway.trajectory("plain")
    assert trajectory.segment_count == 3 and trajectory.side_calls == []
    assert len(trajectory.samples) == 3


async def test_a_thread_taken_up_after_many_other_turns_hashes_its_prompt_right(
    renderer: ChatRenderer,
) -> None:
    """Past the turns whose hash states the rollout keeps (``SequenceHashes.KEPT``), a thread's
    next prompt is hashed from its head's ids: the record's hash chain holds."""
    gateway = sim_gateway(renderer)
    gateway.register("long-gap", {"temperature": 1.0, "seed": 17})
    main, sub = [dict(m) for m in MAIN], [dict(m) for m in SUB]
    await turn(gateway, "long-gap", main, "wait for the subagent")
    for n in range(SequenceHashes.KEPT + 2):
        await turn(gateway, "long-gap", sub, f"search step {n}")
    await turn(gateway, "long-gap", main, "go on")
    trajectory = await gateway.trajectory("long-gap")
    assert [t.segment for t in trajectory.turns] == [0] + [1] * (SequenceHashes.KEPT + 2) + [0]
    assert check_prompt_hashes(trajectory.turns) == []
    assert_each_thread_one_exact_sample(trajectory, threads=2)


async def test_a_rollout_without_tools_labels_no_side_call_whichever_comes_first(
    renderer: ChatRenderer,
) -> None:
    """Without tools the main conversation is unknown: a title call made first, under a
    system prompt of its own, must not make the real conversation a side call."""
    gateway = sim_gateway(renderer)
    gateway.register("no-tools", {"temperature": 1.0, "seed": 19})
    await gateway.chat("no-tools", {"messages": [dict(m) for m in TITLE], "max_tokens": 6})
    main = [dict(m) for m in MAIN]
    await turn(gateway, "no-tools", main, "are you sure?")
    await turn(gateway, "no-tools", main, "thanks")
    trajectory = await gateway.trajectory("no-tools")
    assert trajectory.side_calls == []
    assert [s.segment for s in trajectory.samples] == [0, 1]
