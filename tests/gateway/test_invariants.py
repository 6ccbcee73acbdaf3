"""The three invariants of docs/architecture.md, on real multi-turn conversations with the
embedded model."""

from __future__ import annotations

import asyncio
import hashlib
from array import array
from itertools import pairwise
from typing import Any

import pytest
import pytest_asyncio
import torch

from rollway.engines.embedded import EmbeddedEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.trajectory import Trajectory
from rollway.trajectory_format import check_prompt_hashes, whole_prompts
from tests.conftest import ADD_TOOL, FEW_SHOT, sim_gateway


async def run_tool_conversation(gateway: Gateway, rollout_id: str, turns: int) -> Trajectory:
    gateway.register(rollout_id, {"temperature": 0.7, "seed": 1, "max_tokens": 48})
    messages: list[dict[str, Any]] = [*FEW_SHOT, {"role": "user", "content": "What is 17 + 25?"}]
    for _ in range(turns):
        result = await gateway.chat(rollout_id, {"messages": messages, "tools": [ADD_TOOL]})
        messages.append(result.message)
        for call in result.message.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "42"})
        if not result.message.get("tool_calls"):
            messages.append({"role": "user", "content": "And what is 6 + 7?"})
    return await gateway.trajectory(rollout_id)


def forward_logprobs(
    engine: EmbeddedEngine, ids: list[int], temperature: float = 1.0
) -> torch.Tensor:
    with torch.inference_mode():
        logits = engine.model(torch.tensor([ids], device=engine.device)).logits[0].float()
    return torch.log_softmax(logits / temperature, dim=-1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def trajectory(engine: EmbeddedEngine, renderer: ChatRenderer) -> Trajectory:
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    return await run_tool_conversation(gateway, "inv-1", turns=3)


def test_the_model_called_the_tool_and_the_call_was_parsed(trajectory: Trajectory) -> None:
    first = trajectory.turns[0]
    assert first.tool_calls and first.tool_calls[0]["function"]["name"] == "add"
    assert first.tool_call_parse_error is None


def test_each_turn_prompt_extends_the_previous_prompt_and_completion(
    trajectory: Trajectory,
) -> None:
    assert len(trajectory.turns) == 3 and trajectory.segment_count == 1
    turns = list(whole_prompts(trajectory.turns))
    for (before, prompt), (_, after) in pairwise(turns):
        prefix = prompt + before.completion_ids
        assert after[: len(prefix)] == prefix
        assert len(after) > len(prefix)


def test_loss_mask_is_one_exactly_on_sampled_tokens(trajectory: Trajectory) -> None:
    (sample,) = trajectory.samples
    assert sample.prompt_ids == trajectory.prompt_ids(0)
    assert len(sample.response_ids) == len(sample.loss_mask) == len(sample.logprobs)
    sampled = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m == 1]
    assert sampled == [t for turn in trajectory.turns for t in turn.completion_ids]
    masked_lp = [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m == 1]
    assert masked_lp == [lp for turn in trajectory.turns for lp in turn.logprobs]
    assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if not m)
    last = len(trajectory.turns) - 1
    whole = trajectory.prompt_ids(last) + trajectory.turns[last].completion_ids
    assert sample.prompt_ids + sample.response_ids == whole


def test_logprobs_equal_a_fresh_forward_pass_over_the_recorded_ids(
    trajectory: Trajectory, engine: EmbeddedEngine
) -> None:
    # Sampled at 0.7: the logprobs are the sampling distribution's, what a trainer recomputes
    # at its temperature; the temperature-1 ones stand beside them.
    (sample,) = trajectory.samples
    assert {turn.logprob_kind for turn in trajectory.turns} == {"processed_logprobs"}
    assert sample.raw_logprobs is not None and len(sample.raw_logprobs) == len(sample.logprobs)
    ids = sample.prompt_ids + sample.response_ids
    scaled, raw = forward_logprobs(engine, ids, 0.7), forward_logprobs(engine, ids)
    offset = len(sample.prompt_ids)
    for i, (token, mask) in enumerate(zip(sample.response_ids, sample.loss_mask, strict=True)):
        if mask:
            assert sample.logprobs[i] == pytest.approx(
                scaled[offset + i - 1, token].item(), abs=2e-3
            )
            assert sample.raw_logprobs[i] == pytest.approx(
                raw[offset + i - 1, token].item(), abs=2e-3
            )
        else:
            assert sample.raw_logprobs[i] == 0.0
    assert sample.kept_mass is None  # nothing cut: no top-p, no top-k


def test_trajectory_reports_drift_against_a_fresh_render(trajectory: Trajectory) -> None:
    drift = trajectory.drift
    assert drift is not None
    assert drift.recorded_tokens >= len(trajectory.samples[0].response_ids)
    assert drift.differing_tokens >= 0
    assert (drift.first_mismatch is None) == (drift.differing_tokens == 0)


async def test_a_history_rewrite_starts_a_second_exact_segment(
    gateway: Gateway, engine: EmbeddedEngine
) -> None:
    await run_tool_conversation(gateway, "fold", turns=2)
    folded = [{"role": "user", "content": "Summary so far: 17 + 25 = 42. What is 42 + 1?"}]
    await gateway.chat("fold", {"messages": folded, "tools": [ADD_TOOL]})
    trajectory = await gateway.trajectory("fold")
    assert trajectory.segment_count == 2 and len(trajectory.samples) == 2
    second = trajectory.samples[1]
    assert second.prompt_ids == trajectory.prompt_ids(len(trajectory.turns) - 1)
    assert second.response_ids == trajectory.turns[-1].completion_ids
    assert all(second.loss_mask)
    table = forward_logprobs(engine, second.prompt_ids + second.response_ids, 0.7)
    offset = len(second.prompt_ids) - 1
    expected = [table[offset + i, t].item() for i, t in enumerate(second.response_ids)]
    assert second.logprobs == pytest.approx(expected, abs=2e-3)


async def test_parallel_calls_branching_from_one_turn_become_separate_exact_segments(
    renderer: ChatRenderer,
) -> None:
    gateway = sim_gateway(renderer)
    gateway.register("branch", {})
    first = [{"role": "user", "content": "Start."}]
    reply = (await gateway.chat("branch", {"messages": first})).message
    branches = [[*first, reply, {"role": "user", "content": f"Branch {i}."}] for i in (1, 2)]
    await asyncio.gather(*[gateway.chat("branch", {"messages": b}) for b in branches])
    trajectory = await gateway.trajectory("branch")
    assert trajectory.segment_count == 2 and len(trajectory.turns) == 3
    assert len({t.request_id for t in trajectory.turns}) == 3
    for sample in trajectory.samples:
        last = [t for t in trajectory.turns if t.segment == sample.segment][-1]
        whole = trajectory.prompt_ids(last.index) + last.completion_ids
        assert sample.prompt_ids + sample.response_ids == whole


async def test_changing_tools_starts_a_new_segment(renderer: ChatRenderer) -> None:
    gateway = sim_gateway(renderer)
    gateway.register("tools", {})
    first = [{"role": "user", "content": "Start."}]
    reply = (await gateway.chat("tools", {"messages": first})).message
    follow = [*first, reply, {"role": "user", "content": "Go on."}]
    await gateway.chat("tools", {"messages": follow, "tools": [ADD_TOOL]})
    assert (await gateway.trajectory("tools")).segment_count == 2


def sha256_prompt_hash(ids: list[int]) -> str:
    """The definition in ``Turn.prompt_hash``, computed the slow way."""
    return hashlib.sha256(array("i", ids).tobytes()).hexdigest()[:16]


async def extended_branched_and_rewritten(renderer: ChatRenderer, rollout_id: str) -> Trajectory:
    """Seven turns: four extensions, two parallel branches, then a rewrite (three segments
    or more)."""
    gateway = sim_gateway(renderer, output_len=12)
    gateway.register(rollout_id, {})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for step in range(4):  # extensions
        reply = (await gateway.chat(rollout_id, {"messages": messages})).message
        messages = [*messages, reply, {"role": "user", "content": f"Step {step}."}]
    branches = [[*messages, {"role": "user", "content": f"Branch {i}."}] for i in (1, 2)]
    await asyncio.gather(*[gateway.chat(rollout_id, {"messages": b}) for b in branches])
    await gateway.chat(rollout_id, {"messages": [{"role": "user", "content": "Rewritten."}]})
    trajectory = await gateway.trajectory(rollout_id)
    assert trajectory.segment_count >= 3  # a branch and a rewrite: fresh hashes too
    assert len(trajectory.turns) == 7
    return trajectory


async def test_prompt_hashes_match_their_definition_across_extensions_branches_and_rewrites(
    renderer: ChatRenderer,
) -> None:
    """The gateway hashes only a prompt's new tokens when it extends a turn; every recorded hash
    must still be the hash of the whole prompt, whichever turn it extended."""
    trajectory = await extended_branched_and_rewritten(renderer, "hashes")
    for index, turn in enumerate(trajectory.turns):
        assert turn.prompt_hash == sha256_prompt_hash(trajectory.prompt_ids(index))


def assert_each_turn_keeps_what_it_adds_to_its_segment(trajectory: Trajectory) -> None:
    assert check_prompt_hashes(trajectory.turns) == []
    assert [turn.index for turn in trajectory.turns] == list(range(len(trajectory.turns)))
    previous: dict[int, list[int]] = {}  # each segment's last prompt + completion
    for index, turn in enumerate(trajectory.turns):
        whole = trajectory.prompt_ids(index)
        assert turn.prompt_len == len(whole)
        head = previous.get(turn.segment, [])
        assert whole[: len(head)] == head, index
        assert turn.new_prompt_ids == whole[len(head) :], index
        previous[turn.segment] = whole + turn.completion_ids


def test_each_turn_keeps_the_prompt_past_the_previous_turn_of_its_segment(
    trajectory: Trajectory,
) -> None:
    assert len(trajectory.turns) >= 3
    assert_each_turn_keeps_what_it_adds_to_its_segment(trajectory)


async def test_turns_keep_their_new_prompt_ids_across_branches_and_rewrites(
    renderer: ChatRenderer,
) -> None:
    trajectory = await extended_branched_and_rewritten(renderer, "chain")
    assert_each_turn_keeps_what_it_adds_to_its_segment(trajectory)


async def test_a_trajectory_survives_a_json_round_trip(
    trajectory: Trajectory, renderer: ChatRenderer
) -> None:
    branched = await extended_branched_and_rewritten(renderer, "round-trip")
    for original in (trajectory, branched):
        again = Trajectory.model_validate_json(original.model_dump_json())
        assert again == original
        assert again.samples == original.samples


async def test_an_echoed_tool_call_extends_the_turn_however_its_arguments_are_written(
    renderer: ChatRenderer,
) -> None:
    """Agents send a call back re-serialized (spaces, key order), and arguments JSON that
    orjson refuses (NaN, integers past 64 bits): the conversation still extends the turn."""
    gateway = sim_gateway(renderer)
    for index, (sent, echoed) in enumerate(
        [
            ('{"b": 2, "a": [1, 2.5]}', '{"a":[1,2.5],"b":2}'),
            ('{"x": NaN}', '{"x":NaN}'),
            ('{"n": 123456789012345678901234567890}', '{"n":123456789012345678901234567890}'),
            ("not json at all", "not json at all"),
        ]
    ):
        rollout = f"echo-{index}"
        gateway.register(rollout, {})
        call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": sent}}
        history = [
            {"role": "user", "content": "Add."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "3"},
        ]
        reply = (await gateway.chat(rollout, {"messages": history, "tools": [ADD_TOOL]})).message
        echo = {**call, "function": {"name": "add", "arguments": echoed}}
        again = [*history[:1], {**history[1], "tool_calls": [echo]}, *history[2:], reply]
        again.append({"role": "user", "content": "Thanks."})
        await gateway.chat(rollout, {"messages": again, "tools": [ADD_TOOL]})
        assert (await gateway.trajectory(rollout)).segment_count == 1, sent
