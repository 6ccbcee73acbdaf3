"""A rollout in flight holds each id once, in the turn that added it (its new prompt ids and
its completion, int32 arrays); a turn's whole prompt is joined from its segment's turns when
the engine needs it, so a turn costs its new tokens, not its context. A call that fails, or a
stream closed early, leaves nothing behind; concurrent calls each join what they need; every
turn's whole prompt stays exactly what a gateway that saw only the successful calls would
have sent."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import types
from array import array
from collections.abc import Callable
from typing import Any

from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import EngineError
from rollway.gateway import Gateway
from rollway.gateway.prompt_plan import joined_ids, segment_turns
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import GenerationResult, SamplingParams
from rollway.trajectory import Trajectory
from rollway.trajectory_format import check_prompt_hashes, whole_prompts

Message = dict[str, Any]


class FailsOnce(SimEngine):
    """The sim engine, failing its ``fail_at``-th generation (1-based)."""

    def __init__(self, fail_at: int, **config: Any) -> None:
        super().__init__(SimConfig(**config))
        self.calls, self.fail_at = 0, fail_at

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self.calls += 1
        if self.calls == self.fail_at:
            raise EngineError("the engine fell over")
        return await super().generate(input_ids, sampling, request_id)


def exact(trajectory: Trajectory) -> None:
    """Hashes prove every whole prompt; each sample is its last turn's prompt + completion."""
    assert check_prompt_hashes(trajectory.turns) == []
    for sample in trajectory.samples:
        last = [t for t in trajectory.turns if t.segment == sample.segment][-1]
        whole = trajectory.prompt_ids(last.index) + last.completion_ids
        assert sample.prompt_ids + sample.response_ids == whole


def given_back(gateway: Gateway, rollout: str) -> None:
    """Nothing of a call that ended without a turn is left: the last turn's segment holds its
    whole sequence exactly once, in its turns (no copy of the context beside them)."""
    state = gateway._rollouts[rollout]
    last = state.turns[-1]
    held = joined_ids(segment_turns(state.turns, last))
    assert len(held) == last.prompt_len + len(last.completion_ids)
    assert not any(isinstance(v, array) for v in vars(state).values())


async def converse(gateway: Gateway, rollout: str, steps: int, fail_ok: bool = False) -> None:
    """``steps`` turns of one growing conversation; a failed call is asked again."""
    messages: list[Message] = [{"role": "user", "content": "Start."}]
    for step in range(steps):
        while True:
            try:
                reply = await gateway.chat(rollout, {"messages": messages})
                break
            except EngineError:
                assert fail_ok
                given_back(gateway, rollout)
        messages += [reply.message, {"role": "user", "content": f"Observation {step}."}]


async def test_a_failed_call_leaves_the_next_turn_exactly_as_without_it(
    renderer: ChatRenderer,
) -> None:
    flaky = Gateway(FailsOnce(fail_at=3, output_len=5), renderer, model_name="sim")
    clean = Gateway(SimEngine(SimConfig(output_len=5)), renderer, model_name="sim")
    for gateway in (flaky, clean):
        gateway.register("r", {})
        await converse(gateway, "r", 5, fail_ok=gateway is flaky)
    got, want = await flaky.trajectory("r"), await clean.trajectory("r")
    assert got.segment_count == 1 and len(got.turns) == 5
    exact(got)
    assert [p for _, p in whole_prompts(got.turns)] == [p for _, p in whole_prompts(want.turns)]
    assert [t.new_prompt_ids for t in got.turns] == [t.new_prompt_ids for t in want.turns]


async def test_a_stream_closed_early_leaves_nothing_behind(renderer: ChatRenderer) -> None:
    gateway = Gateway(
        SimEngine(SimConfig(output_len=8, per_token_s=0.02)), renderer, model_name="sim"
    )
    gateway.register("s", {})
    messages: list[Message] = [{"role": "user", "content": "Start."}]
    reply = await gateway.chat("s", {"messages": messages})
    messages += [reply.message, {"role": "user", "content": "Go on."}]
    stream = gateway.chat_stream("s", {"messages": messages})
    async with contextlib.aclosing(stream):
        async for _ in stream:
            break  # the caller goes away after the first piece
    given_back(gateway, "s")
    reply = await gateway.chat("s", {"messages": messages})
    messages += [reply.message, {"role": "user", "content": "And on."}]
    await gateway.chat("s", {"messages": messages})
    trajectory = await gateway.trajectory("s")
    exact(trajectory)
    last = trajectory.turns[-1]
    before = trajectory.turns[-2]
    # The last turn extends the one before it: nothing of the closed stream's prompt is left.
    assert last.segment == before.segment
    assert trajectory.prompt_ids(last.index)[: before.prompt_len] == trajectory.prompt_ids(
        before.index
    )


async def test_branches_copy_the_head_and_each_goes_on_exactly(renderer: ChatRenderer) -> None:
    gateway = Gateway(
        SimEngine(SimConfig(output_len=4, latency_s=0.01)), renderer, model_name="sim"
    )
    gateway.register("b", {})
    first: list[Message] = [{"role": "user", "content": "Start."}]
    reply = (await gateway.chat("b", {"messages": first})).message
    branches = [[*first, reply, {"role": "user", "content": f"Branch {i}."}] for i in (1, 2)]
    answers = await asyncio.gather(*[gateway.chat("b", {"messages": b}) for b in branches])
    # Each branch goes on; the later one extends the last turn, the other starts afresh.
    for branch, answer in zip(branches, answers, strict=True):
        branch += [answer.message, {"role": "user", "content": "More."}]
        await gateway.chat("b", {"messages": branch})
    trajectory = await gateway.trajectory("b")
    exact(trajectory)
    first_prompt = trajectory.prompt_ids(0) + trajectory.turns[0].completion_ids
    assert trajectory.prompt_ids(1)[: len(first_prompt)] == first_prompt
    assert trajectory.prompt_ids(2)[: len(first_prompt)] == first_prompt
    assert trajectory.segment_count >= 2


async def test_a_rollout_holds_its_context_once(renderer: ChatRenderer) -> None:
    """The turns' stored ids add up to the context (not to turns x context)."""
    gateway = Gateway(SimEngine(SimConfig(output_len=16)), renderer, model_name="sim")
    gateway.register("long", {})
    await converse(gateway, "long", 40)
    trajectory = await gateway.trajectory("long")
    (sample,) = trajectory.samples
    stored = sum(len(t.new_prompt_ids) + len(t.completion_ids) for t in trajectory.turns)
    assert stored == len(sample.prompt_ids) + len(sample.response_ids)
    assert sum(t.prompt_len for t in trajectory.turns) > 15 * stored  # what format 1 stored


async def test_ids_in_flight_are_int32_arrays_and_the_record_is_exactly_the_engines(
    renderer: ChatRenderer,
) -> None:
    """A rollout in flight holds its ids as int32 and its logprobs as float64 arrays (4 and 8
    bytes, not a list's 36); the record gets lists again, the engine's values exactly."""
    gateway = Gateway(SimEngine(SimConfig(output_len=16)), renderer, model_name="sim")
    gateway.register("r", {})
    messages: list[Message] = [{"role": "user", "content": "Start."}]
    answers = []
    for step in range(3):
        answer = await gateway.chat("r", {"messages": messages})
        answers.append(answer)
        messages += [answer.message, {"role": "user", "content": f"Step {step}."}]
    state = gateway._rollouts["r"]
    for turn in state.turns:
        assert turn.new_prompt_ids.typecode == turn.completion_ids.typecode == "i"  # type: ignore[attr-defined]
        assert turn.logprobs.typecode == "d"  # type: ignore[attr-defined]
    trajectory = await gateway.trajectory("r")
    for turn, answer in zip(trajectory.turns, answers, strict=True):
        assert type(turn.completion_ids) is list and turn.completion_ids == answer.completion_ids
        assert type(turn.logprobs) is list and turn.logprobs == answer.logprobs
    text = trajectory.model_dump_json()
    assert Trajectory.model_validate_json(text).model_dump_json() == text
    exact(trajectory)


class Recording(SimEngine):
    """The sim engine, keeping each prompt it was given (as the gateway sent it)."""

    def __init__(self, **config: Any) -> None:
        super().__init__(SimConfig(**config))
        self.prompts: list[list[int]] = []

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self.prompts.append(list(input_ids))
        return await super().generate(input_ids, sampling, request_id)


def int_arrays_reachable(root: object) -> list[array[int]]:
    """Every int array reachable from ``root`` through its objects' references (not through
    classes, modules or functions: those lead to the whole program)."""
    seen, found, stack = {id(root)}, [], [root]
    while stack:
        for child in gc.get_referents(stack.pop()):
            if id(child) in seen or isinstance(child, type | types.ModuleType | Callable):
                continue
            seen.add(id(child))
            if isinstance(child, array):
                found += [child] if child.typecode == "i" else []
            else:
                stack.append(child)
    return found


async def test_a_prompt_joined_from_the_turns_is_the_one_the_engine_got(
    renderer: ChatRenderer,
) -> None:
    """Each turn's whole prompt, joined from its segment's turns (in flight) and from the
    record, is the list the engine was given; its turns' lists stay aligned: a logprob per
    completion id, and the sample's loss mask on exactly the sampled ids."""
    engine = Recording(output_len=9)
    gateway = Gateway(engine, renderer, model_name="sim")
    gateway.register("j", {"seed": 3})
    first: list[Message] = [{"role": "user", "content": "Start."}]
    reply = (await gateway.chat("j", {"messages": first})).message
    branches = [[*first, reply, {"role": "user", "content": f"Branch {i}."}] for i in (1, 2)]
    await asyncio.gather(*[gateway.chat("j", {"messages": b}) for b in branches])
    await converse(gateway, "j", 4)
    turns = gateway._rollouts["j"].turns
    assert len({t.segment for t in turns}) == 3 and len(engine.prompts) == len(turns)
    trajectory = await gateway.trajectory("j")
    for turn, sent in zip(turns, engine.prompts, strict=True):
        before = [t for t in turns[: turn.index] if t.segment == turn.segment]
        joined = joined_ids(before, turn.new_prompt_ids)
        assert joined.typecode == "i" and joined.tolist() == sent == trajectory.prompt_ids(
            turn.index
        )
        assert len(turn.logprobs) == len(turn.completion_ids) > 0
    for sample in trajectory.samples:
        mine = [t for t in trajectory.turns if t.segment == sample.segment]
        assert len(sample.loss_mask) == len(sample.response_ids) == len(sample.logprobs)
        sampled = [i for i, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
        assert sampled == [i for t in mine for i in t.completion_ids]
        kept = [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m]
        assert kept == [lp for t in mine for lp in t.logprobs]
    exact(trajectory)


async def test_between_calls_a_rollout_holds_its_context_once_in_int32(
    renderer: ChatRenderer,
) -> None:
    """All the int arrays the rollout's state reaches add up to its context, once: no copy of
    the sequence is kept beside the turns (the sequence tip once held a second one)."""
    gateway = Gateway(FailsOnce(fail_at=4, output_len=16), renderer, model_name="sim")
    gateway.register("once", {})
    await converse(gateway, "once", 12, fail_ok=True)
    state = gateway._rollouts["once"]
    held = int_arrays_reachable(state)
    (sample,) = (await gateway.trajectory("once")).samples
    assert sum(len(ids) for ids in held) == len(sample.prompt_ids) + len(sample.response_ids)
