"""The state of one registered rollout: its settings, turns and conversation so far."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollway.gateway.render.chat_template import ChatRenderer, content_text
from rollway.gateway.render.reasoning import sent_reasoning
from rollway.generation import ChatResult, Message, SamplingParams
from rollway.trajectory import Refusals, Turn, TurnFields

MessageKey = tuple[Any, ...]


class SequenceHashes:
    """The sha256 state of recent turns' whole sequences (prompt + completion). A turn that
    extends one of them hashes only its new tokens: hashing the whole prompt again costs
    about 16 ns a token, a third of a millisecond per turn at 20,000 tokens."""

    KEPT = 8  # turns: the last of each branch a concurrent agent may still extend

    def __init__(self) -> None:
        self._by_turn: dict[int, tuple[int, Any]] = {}

    def prompt_hash(
        self, parent: int | None, start: int, tail: array[int], head: Callable[[], array[int]]
    ) -> tuple[str, Any]:
        """``prompt_hash`` of a whole prompt and the hash state after it: ``tail`` past the
        first ``start`` ids, which are turn ``parent``'s whole sequence (None: a fresh prompt,
        ``start`` 0). ``head`` joins those ``start`` ids, called only when this does not know
        ``parent``'s hash state."""
        known = self._by_turn.get(parent) if parent is not None else None
        if known is not None and known[0] == start:
            state = known[1].copy()
        else:
            state = hashlib.sha256(head().tobytes() if start else b"")
        state.update(tail.tobytes())
        return state.hexdigest()[:16], state

    def remember(
        self, turn: int, prompt_state: Any, prompt_len: int, completion: array[int]
    ) -> None:
        """Keep the hash state of turn ``turn``'s whole sequence, for a turn that extends it."""
        state = prompt_state.copy()
        state.update(completion.tobytes())
        self._by_turn[turn] = (prompt_len + len(completion), state)
        if len(self._by_turn) > self.KEPT:
            del self._by_turn[next(iter(self._by_turn))]


@dataclass(frozen=True, slots=True)
class Conversation:
    """A request's messages as the gateway uses them (validated dicts) with their keys, and
    the list as it was sent when the next request may be checked against it (else None)."""

    messages: list[Message]
    keys: list[MessageKey]
    sent: list[Any] | None = None


@dataclass(frozen=True, slots=True)
class ThreadTip:
    """Where one conversation thread of a rollout stands: its last turn (the tip of its
    segment) and the conversation that turn closed. A request that extends any thread's tip
    extends its segment, so a subagent or side call running between two turns of the main
    conversation leaves it one sample."""

    turn: int
    messages: list[Message]
    keys: list[MessageKey]
    tools: list[dict[str, Any]] | None


#: Threads a rollout keeps tips of (the most recently answered): a main conversation, its
#: subagents and side calls.
KEPT_THREADS = 8


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
    #: Where the template renders earlier answers differently once more messages follow:
    #: ``as_sampled`` extends the sampled ids (one sample), ``as_template`` starts a segment.
    history: str = "as_sampled"
    #: The rollout's own renderer (registration's ``renderer``); None: the gateway's.
    renderer: ChatRenderer | None = None
    turns: list[Turn] = field(default_factory=list)
    #: The last request's messages plus the reply the gateway gave, as sent over the wire.
    messages: list[Message] = field(default_factory=list)
    #: The same, normalized, to tell whether the next request extends it.
    message_keys: list[MessageKey] = field(default_factory=list)
    #: The last request's messages as sent (``Conversation.sent``): the next request's are
    #: checked only past them.
    sent_messages: list[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    #: Each thread's tip by segment, the most recently answered last (at most KEPT_THREADS).
    tips: dict[int, ThreadTip] = field(default_factory=dict)
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
    #: Hash states of recent turns' sequences: a prompt that extends one hashes its tail only.
    sequence_hashes: SequenceHashes = field(default_factory=SequenceHashes)
    #: The conversations its calls held, by their openings' hashes (``conversations``), and
    #: how many it may hold before the gateway warns (None: the default).
    openings: set[int] = field(default_factory=set)
    max_conversations: int | None = None
    #: Each segment's first message and whether its first request offered tools
    #: (``conversations.side_call_segments``), and whether side calls are labelled.
    segment_openings: dict[int, tuple[MessageKey | None, bool]] = field(default_factory=dict)
    side_calls: str = "label"
    #: Fields of the requests that changed nothing sampled, by the turns they made.
    request_fields: list[TurnFields] = field(default_factory=list)
    #: The 4xx answers its agent got: how many, and the first.
    refusals: Refusals | None = None

    def record_fields(self, answers: list[ChatResult], fields: dict[str, Any]) -> None:
        """Keep a request's recorded fields with each turn it made."""
        if fields:
            self.request_fields += [
                TurnFields(turn=a.turn_index, fields=fields)
                for a in answers
                if a.turn_index is not None
            ]

    def note_refusal(self, status: int, body: dict[str, Any]) -> None:
        if self.refusals is None:
            self.refusals = Refusals(count=1, first_status=status, first_body=body)
        else:
            self.refusals = self.refusals.model_copy(update={"count": self.refusals.count + 1})

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
        conversation: Conversation,
        reply: Message,
        tools: list[dict[str, Any]] | None,
        turn: Turn | None = None,
    ) -> None:
        """The conversation now ends with ``reply``: the next request should extend it (or
        another thread's tip). ``turn`` is the turn that answered it, the tip of its thread."""
        self.messages = [*conversation.messages, reply]
        self.message_keys = [*conversation.keys, message_key(reply)]
        self.sent_messages = conversation.sent
        self.tools = tools
        if turn is not None:
            self.tips.pop(turn.segment, None)
            self.tips[turn.segment] = ThreadTip(turn.index, self.messages, self.message_keys, tools)
            if len(self.tips) > KEPT_THREADS:
                del self.tips[next(iter(self.tips))]

    def other_tips(self) -> list[ThreadTip]:
        """The tips of threads other than the last answered one, most recent first."""
        last = self.turns[-1].index if self.turns else None
        return [tip for tip in reversed(self.tips.values()) if tip.turn != last]

    def sampling_for(self, asked: dict[str, Any]) -> SamplingParams:
        """Registered sampling params win; the request fills only what registration left
        open, and asks for top logprobs and entropy beside them. A seed moves on by one per
        turn, so turns of a seeded rollout differ."""
        locked = self.locked_sampling
        merged = {**asked, **locked}
        if "max_tokens" in asked and "max_tokens" in locked:
            merged["max_tokens"] = min(asked["max_tokens"], locked["max_tokens"])
        # What to record beside the tokens is no sampling behaviour to guard: a turn records
        # what either side asked (an OpenAI client's own top_logprobs is answered from it).
        merged["top_logprobs"] = max(asked.get("top_logprobs", 0), locked.get("top_logprobs", 0))
        merged["record_entropy"] = bool(asked.get("record_entropy") or locked.get("record_entropy"))
        if merged.get("seed") is not None:
            merged["seed"] += self.turns_started
        return SamplingParams(**merged)

    def recorded_sampling(self, sampling: SamplingParams) -> dict[str, Any]:
        """``sampling`` as a turn records it: the previous turn's own dict where they are
        equal (turns of a rollout mostly sample alike; a dict a turn saves memory over long
        rollouts held in flight). Recorded dicts are never changed in place."""
        fields = sampling.to_dict()
        previous = self.turns[-1].sampling if self.turns else None
        return previous if previous == fields else fields

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
    """What identifies a message for rendering: role, text, tool calls (arguments canonical)
    and, last, an answer's reasoning: read from ``reasoning_content`` or from inside the
    content, None where the message has none (``same_answer`` takes that for the answer as
    sampled: an agent may drop the reasoning it was given)."""
    role = "system" if message["role"] == "developer" else message["role"]
    calls = tuple(
        (c["function"]["name"], _canonical_json(c["function"].get("arguments", "{}")))
        for c in message.get("tool_calls") or ()
    )
    content = content_text(message.get("content"))
    reasoning = None
    if role == "assistant":
        reasoning, content = sent_reasoning(message.get("reasoning_content"), content)
    return (role, content, calls, message.get("tool_call_id"), reasoning)


def same_answer(sent: MessageKey, answered: MessageKey) -> bool:
    """Whether a message sent back is the gateway's answer ``answered``: the same, or the same
    with its reasoning dropped. A changed reasoning is an edit, as a changed content is."""
    return sent == answered or (sent[-1] is None and sent[:-1] == answered[:-1])


def _canonical_json(arguments: str | dict[str, Any]) -> str:
    """One text per JSON value, so that an agent's re-serialized echo of a call matches the
    call. The json module, not orjson: orjson writes NaN, Infinity and 1e400 all as null and
    reads integers past 64 bits as floats, so values the template renders differently would
    share a key (and a changed earlier call would pass for the old one)."""
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    try:
        return json.dumps(value, sort_keys=True)
    except (ValueError, RecursionError):  # nested past the recursion limit: keep its text
        return repr(value)
