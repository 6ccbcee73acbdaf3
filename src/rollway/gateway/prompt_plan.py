"""A turn's prompt ids: the last turn extended when the request appends to it, else a fresh
render that starts a new segment; within a token budget, and off the event loop when large."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import orjson

from rollway.gateway.render.chat_template import ChatRenderer, TokenBudgetExceeded
from rollway.gateway.rollout_state import Conversation, MessageKey, RolloutState, SequenceTip

#: Inputs up to this many characters are rendered and tokenized on the event loop: a hop to a
#: worker thread would cost about as much as the work. Larger ones never block the loop.
INLINE_CHARS = 8192

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class PromptPlan:
    #: int32, as the rollout holds them (``SequenceTip``); a list for the engine.
    prompt_ids: array[int]
    #: The segment and turn this prompt extends; None for a fresh render.
    segment: int | None
    parent: int | None
    #: Where its ids past the parent's sequence begin (0 for a fresh render).
    start: int = 0
    #: The rollout's tip when ``prompt_ids`` is its list, extended in place for this call:
    #: the call records or releases it (``SequenceTip``).
    tip: SequenceTip | None = None

    def release(self) -> None:
        """The call ends without recording a turn: give the tip back as it was."""
        if self.tip is not None:
            self.tip.release()


async def plan_prompt(
    renderer: ChatRenderer,
    state: RolloutState,
    conversation: Conversation,
    tools: list[dict[str, Any]] | None,
    budget: int | None,
) -> PromptPlan:
    """The prompt for ``messages``; raises ``TokenBudgetExceeded`` past ``budget`` tokens,
    ruling out an over-long prompt from its length before tokenizing it where it can."""
    messages, keys = conversation.messages, conversation.keys
    last = state.turns[-1] if state.turns else None
    tip = state.tip
    known = len(state.message_keys)
    if (
        last is not None
        and tip is not None
        and tip.turn == last.index
        and last.finish_reason != "abort"
        and tools == state.tools
        and keys[:known] == state.message_keys
    ):
        base = tip.length
        room = None if budget is None else budget - base
        extend = renderer.continuation_ids
        keep = state.history == "as_sampled"
        try:
            tail = await _render(
                keys[known:],
                tools,
                extend,
                list(last.completion_ids),
                messages[known:],
                tools,
                room,
                keep,
            )
        except TokenBudgetExceeded as exc:
            raise TokenBudgetExceeded(base + exc.at_least) from None
        if tail is not None:
            # The render may have waited: another call of the rollout may hold the tip, or
            # have moved it on (a tip only grows past ``base``, so its head is still ours).
            if state.tip is tip and tip.turn == last.index and not tip.claimed:
                return PromptPlan(tip.claim(tail), last.segment, last.index, base, tip)
            return PromptPlan(tip.ids[:base] + array("i", tail), last.segment, last.index, base)
    ids = await _render(keys, tools, renderer.prompt_ids, messages, tools, budget)
    return PromptPlan(array("i", ids), None, None)


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
