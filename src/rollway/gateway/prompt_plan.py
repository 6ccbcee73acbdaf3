"""A turn's prompt ids: the last turn extended when the request appends to it, else a fresh
render that starts a new segment; within a token budget, and off the event loop when large."""

from __future__ import annotations

import asyncio
import dataclasses
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import orjson

from rollway.gateway.render.chat_template import ChatRenderer, TokenBudgetExceeded
from rollway.gateway.render.prefill import Prefill, read_prefill
from rollway.gateway.rollout_state import Conversation, MessageKey, RolloutState, same_answer
from rollway.generation import Message
from rollway.trajectory import Turn

#: Inputs up to this many characters are rendered and tokenized on the event loop: a hop to a
#: worker thread would cost about as much as the work. Larger ones never block the loop.
INLINE_CHARS = 8192

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class PromptPlan:
    """A turn's prompt, each id held once: the ids its segment's turns already hold (``head``,
    through the parent: its whole sequence) and the ids this turn adds (``tail``, which the
    turn keeps as its ``new_prompt_ids``). A fresh render has no head. The whole prompt is
    joined from them only when it is needed whole (``ids``: the engine's input), so a rollout
    between calls holds each id once, in the turn that added it."""

    #: int32, as the turn will hold them (``Turn.as_recorded``).
    tail: array[int]
    #: The segment and turn this prompt extends; None for a fresh render.
    segment: int | None
    parent: int | None
    #: The segment's turns through ``parent``, in order (empty for a fresh render).
    head: tuple[Turn, ...] = ()
    #: How many ids the head holds: where ``tail`` begins in the whole prompt.
    start: int = 0
    #: The final assistant message the prompt continues (None: it asks for a new answer).
    prefill: Prefill | None = None
    #: The conversation as the thread it extends answered it (None: as the request sent it,
    #: less a prefill).
    conversation: Conversation | None = None

    @property
    def prompt_len(self) -> int:
        return self.start + len(self.tail)

    def ids(self) -> array[int]:
        """The whole prompt, a fresh array: the head's ids and the tail, one copy of each."""
        return joined_ids(self.head, self.tail)


def joined_ids(turns: Sequence[Turn], tail: Sequence[int] = ()) -> array[int]:
    """The ids of ``turns`` (each its new prompt ids, then its completion), then ``tail``: a
    segment's sequence from the turns that hold it. Arrays extend an array by a memcpy."""
    ids: array[int] = array("i")
    for turn in turns:
        ids.extend(turn.new_prompt_ids)
        ids.extend(turn.completion_ids)
    ids.extend(tail)
    return ids


def segment_turns(turns: Sequence[Turn], last: Turn) -> tuple[Turn, ...]:
    """The turns of ``last``'s segment through ``last``: a segment is one chain, each turn
    extending the one before it in the segment (a branch starts a new segment)."""
    return tuple(t for t in turns[: last.index + 1] if t.segment == last.segment)


async def plan_prompt(
    renderer: ChatRenderer,
    state: RolloutState,
    conversation: Conversation,
    tools: list[dict[str, Any]] | None,
    budget: int | None,
    continue_final: bool = False,
) -> PromptPlan:
    """The prompt for ``messages``: the tip of the thread it extends (the last answered
    conversation first, then the other threads' tips, most recent first), else a fresh render
    that starts a segment. Raises ``TokenBudgetExceeded`` past ``budget`` tokens, ruling out an
    over-long prompt from its length before tokenizing it where it can. With
    ``continue_final`` the last message is not answered but continued: the prompt ends with
    its head (``render.prefill``; a 422 where it cannot be continued)."""
    messages, keys = conversation.messages, conversation.keys
    prefill = None
    if continue_final:
        prefill = await _render(keys, tools, read_prefill, renderer, messages, tools)
        messages, keys = messages[:-1], keys[:-1]
    last = state.turns[-1] if state.turns else None
    known = len(state.message_keys)
    if (
        last is not None
        and tools == state.tools
        and keys[:known] == state.message_keys
        and (prefill is None or known < len(keys))
    ):
        plan = await _extend(renderer, state, last, known, messages, keys, budget, tools, prefill)
        if plan is not None:
            return plan
    for tip in state.other_tips():
        known = len(tip.keys)
        if tip.tools != tools or not answered_as(keys, tip.keys):
            continue
        if prefill is not None and known >= len(keys):
            continue
        # The tip's answer as it was answered (its reasoning), as for the last conversation.
        matched = [*messages[: known - 1], tip.messages[-1], *messages[known:]]
        matched_keys = [*tip.keys, *keys[known:]]
        turn = state.turns[tip.turn]
        plan = await _extend(
            renderer, state, turn, known, matched, matched_keys, budget, tools, prefill
        )
        if plan is not None:
            return dataclasses.replace(plan, conversation=Conversation(matched, matched_keys))
    if prefill is not None:
        ids = await _render(keys, tools, renderer.encode, prefill.asked + prefill.head, budget)
    else:
        ids = await _render(keys, tools, renderer.prompt_ids, messages, tools, budget)
    return PromptPlan(array("i", ids), None, None, prefill=prefill)


async def _extend(
    renderer: ChatRenderer,
    state: RolloutState,
    last: Turn,
    known: int,
    messages: list[Message],
    keys: list[MessageKey],
    budget: int | None,
    tools: list[dict[str, Any]] | None,
    prefill: Prefill | None,
) -> PromptPlan | None:
    """The prompt that extends turn ``last``, whose conversation (``known`` messages) ``keys``
    begins with; None where it cannot be extended (an aborted turn, a history the template
    renders otherwise)."""
    if last.finish_reason == "abort":
        return None
    base = last.prompt_len + len(last.completion_ids)
    room = None if budget is None else budget - base
    keep = state.history == "as_sampled"
    try:
        tail = await _render(
            keys[known:],
            tools,
            renderer.continuation_ids,
            list(last.completion_ids),
            messages[known:],
            tools,
            room,
            keep,
        )
        if tail is not None and prefill is not None:
            left = None if room is None else room - len(tail)
            tail += renderer.encode(prefill.head, left)
    except TokenBudgetExceeded as exc:
        raise TokenBudgetExceeded(base + exc.at_least) from None
    if tail is None:
        return None
    # Turns are only appended: the parent's segment through it stays as it is, even if
    # another call of the rollout records a turn while this one renders or samples.
    head = segment_turns(state.turns, last)
    return PromptPlan(array("i", tail), last.segment, last.index, head, base, prefill)


def answered_as(keys: list[MessageKey], answered: list[MessageKey]) -> bool:
    """Whether ``keys`` begin with the conversation ``answered`` (a thread's tip): equal, its
    answers sent back as answered or with their reasoning dropped."""
    if len(keys) < len(answered):
        return False
    return all(same_answer(key, own) for key, own in zip(keys, answered, strict=False))


async def _render(
    keys: list[MessageKey],
    tools: list[dict[str, Any]] | None,
    render: Callable[P, R],
    *args: P.args,
    **kwargs: P.kwargs,
) -> R:
    """``render(...)``, in a worker thread unless the messages (``keys``) and ``tools`` are
    small: templating and tokenizing grow with the input."""
    size = sum(len(key[1]) + sum(len(arguments) for _, arguments in key[2]) for key in keys)
    size += len(orjson.dumps(tools)) if tools else 0
    if size <= INLINE_CHARS:
        return render(*args, **kwargs)
    return await asyncio.to_thread(render, *args, **kwargs)
