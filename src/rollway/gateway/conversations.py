"""How many conversations a rollout's calls hold, and which are side calls. One agent's
rollout is one conversation, or a few where subagents and side calls (a title, a summary) run
beside it; calls of many rollouts sent to one rollout's URL and key (a client that knows one
base URL) look like many. Past the rollout's bound the gateway says so, once, in its log, and
the trajectory counts them: such rollouts are never merged silently. Side calls are labelled
(``Trajectory.side_calls``) and left out of the training samples unless the rollout asks."""

from __future__ import annotations

import logging
from typing import Any

from rollway.gateway.rollout_state import Conversation, RolloutState
from rollway.trajectory import Turn

log = logging.getLogger(__name__)

#: Conversations a rollout may hold before the gateway warns (registration's
#: ``max_conversations``): a main thread with a few subagents and side calls stays under it.
DEFAULT_MAX_CONVERSATIONS = 4
#: Openings kept per rollout to tell them apart; past it the count stops growing.
_KEPT = 1024


def note_conversation(state: RolloutState, conversation: Conversation) -> None:
    """Count the conversation ``conversation`` belongs to, by its opening: its first message
    that is not a system message (a task's question; a subagent's brief)."""
    opening = next((key for key in conversation.keys if key[0] != "system"), None)
    if opening is None or len(state.openings) >= _KEPT:
        return
    state.openings.add(hash(opening))
    bound = state.max_conversations or DEFAULT_MAX_CONVERSATIONS
    if len(state.openings) == bound + 1:
        log.warning(
            "rollout %s holds %d conversations (more than its max_conversations, %d): calls of "
            "separate rollouts may be sharing its base URL and key; give each rollout its own "
            "(or raise max_conversations for an agent with subagents)",
            state.rollout_id,
            bound + 1,
            bound,
            extra={"rollout_id": state.rollout_id, "stage": "conversations"},
        )


def note_segment(
    state: RolloutState,
    turn: Turn,
    conversation: Conversation,
    tools: list[dict[str, Any]] | None,
) -> None:
    """Keep how the segment ``turn`` belongs to began: its first message, and whether it
    offered tools (its first turn says)."""
    if turn.segment not in state.segment_openings:
        opening = conversation.keys[0] if conversation.keys else None
        state.segment_openings[turn.segment] = (opening, bool(tools))


def side_call_segments(state: RolloutState) -> list[int]:
    """The segments that are side calls: in a rollout whose main conversation (the first
    segment that offers tools) offers tools, as a harness's does, those that offer none and
    open with a system prompt of their own, one the main conversation does not open with, as
    a harness's title or summary call does. A subagent offers tools; a fold or a branch keeps
    the main conversation's opening, or starts afresh from a user message: none is one. A
    rollout without tools has none: which of its conversations is the main one is unknown."""
    openings = state.segment_openings
    if state.side_calls != "label":
        return []
    main = next((o for o, tools in openings.values() if tools), None)
    if main is None:
        return []
    return sorted(
        s
        for s, (o, tools) in openings.items()
        if not tools and o is not None and o[0] == "system" and o != main
    )
