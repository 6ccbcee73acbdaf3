"""The state of one registered rollout: its settings, turns and conversation so far."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from rollway.gateway.chat_template import Message, content_text
from rollway.types import SamplingParams, Turn

MessageKey = tuple[Any, ...]


@dataclass(eq=False)
class RolloutState:
    rollout_id: str
    api_key: str
    model: str
    sampling: SamplingParams
    #: Sampling fields set at registration; they override what a chat request asks.
    locked_sampling: dict[str, Any]
    max_turns: int | None
    max_seq_len: int | None
    metadata: dict[str, Any]
    turns: list[Turn] = field(default_factory=list)
    #: The last request's messages plus the reply the gateway gave, as sent over the wire.
    messages: list[Message] = field(default_factory=list)
    #: The same, normalized, to tell whether the next request extends it.
    message_keys: list[MessageKey] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    turns_started: int = 0
    segment_count: int = 0
    #: Engine requests running now, with when each was sent (``time.monotonic``).
    in_flight: dict[str, float] = field(default_factory=dict)
    cancelled: bool = False
    #: The cancel cut the rollout short: it aborted a generation or refused a later call.
    #: (The client cancels every rollout at cleanup; that alone marks nothing.)
    cut_by_cancel: bool = False
    #: Engine failures its calls met (the last few): a program agent that exits on a 502
    #: is then known to have failed for the engine, not for itself.
    engine_errors: list[str] = field(default_factory=list)
    truncation_reason: str | None = None
    #: False behind a chat-level engine: turns hold messages, not token ids.
    has_token_ids: bool = True
    #: Responses API ids this rollout answered, with the conversation each closed.
    responses: dict[str, list[Message]] = field(default_factory=dict)
    #: When the rollout was last used (``time.monotonic``), and chat calls running now: an
    #: idle rollout expires after the gateway's TTL, a busy one never.
    last_active: float = field(default_factory=time.monotonic)
    busy: int = 0
    #: The trace context it was registered under (``rollway.tracing``; None when off): the
    #: parent of turns whose request carries none (a program that does not propagate it).
    trace_parent: Any = None

    def next_segment(self) -> int:
        self.segment_count += 1
        return self.segment_count - 1

    def last_in_segment(self, segment: int) -> Turn | None:
        return next((t for t in reversed(self.turns) if t.segment == segment), None)

    def begin_turn(self) -> str:
        """Count a turn that goes to the engine; its request id."""
        self.turns_started += 1
        return f"{self.rollout_id}-{self.turns_started}"

    def close_turn(
        self,
        messages: list[Message],
        keys: list[MessageKey],
        reply: Message,
        tools: list[dict[str, Any]] | None,
    ) -> None:
        """The conversation now ends with ``reply``: the next request should extend it."""
        self.messages = [*messages, reply]
        self.message_keys = [*keys, message_key(reply)]
        self.tools = tools

    def sampling_for(self, asked: dict[str, Any]) -> SamplingParams:
        """Registered sampling params win; the request fills only what registration left
        open. A seed moves on by one per turn, so turns of a seeded rollout differ."""
        merged = {**asked, **self.locked_sampling}
        if "max_tokens" in asked and "max_tokens" in self.locked_sampling:
            merged["max_tokens"] = min(asked["max_tokens"], self.locked_sampling["max_tokens"])
        if merged.get("seed") is not None:
            merged["seed"] += self.turns_started
        return SamplingParams(**merged)

    def mark_truncated(self, reason: str) -> bool:
        """Record why the rollout was cut; True the first time (the reason that counts)."""
        if self.truncation_reason is not None:
            return False
        self.truncation_reason = reason
        return True

    def snapshot(self) -> RolloutState:
        """A copy whose turn list stays as it is now, to read off the event loop while the
        loop goes on recording (turns are appended, the other fields are replaced whole)."""
        return dataclasses.replace(self, turns=list(self.turns))


def message_key(message: Message) -> MessageKey:
    """What identifies a message for rendering: role, text, tool calls (arguments canonical)."""
    role = "system" if message["role"] == "developer" else message["role"]
    calls = tuple(
        (c["function"]["name"], _canonical_json(c["function"].get("arguments", "{}")))
        for c in message.get("tool_calls") or ()
    )
    return (role, content_text(message.get("content")), calls, message.get("tool_call_id"))


def _canonical_json(arguments: str | dict[str, Any]) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


def prompt_hash(ids: list[int]) -> str:
    return hashlib.sha256(array("i", ids).tobytes()).hexdigest()[:16]
