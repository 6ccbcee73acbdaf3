"""The state of one registered rollout, and how its turns become samples and a drift figure."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from rollway.gateway.chat_template import ChatRenderer, Message, content_text
from rollway.types import Drift, Sample, SamplingParams, Trajectory, Turn

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
    in_flight: set[str] = field(default_factory=set)
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

    def next_segment(self) -> int:
        self.segment_count += 1
        return self.segment_count - 1

    def last_in_segment(self, segment: int) -> Turn | None:
        return next((t for t in reversed(self.turns) if t.segment == segment), None)

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


def build_samples(turns: list[Turn]) -> list[Sample]:
    """One sample per segment: the first prompt, then completions (mask 1) and glue (mask 0).
    Policy versions follow the tokens (-1 on glue), where every turn of the segment has them."""
    samples: dict[int, Sample] = {}
    consumed: dict[int, int] = {}
    versioned = {t.segment for t in turns if t.policy_versions is not None}
    versioned -= {t.segment for t in turns if t.policy_versions is None}
    for turn in turns:
        sample = samples.get(turn.segment)
        if sample is None:
            sample = samples[turn.segment] = Sample(
                segment=turn.segment,
                prompt_ids=list(turn.prompt_ids),
                response_ids=[],
                loss_mask=[],
                logprobs=[],
                policy_versions=[] if turn.segment in versioned else None,
            )
            consumed[turn.segment] = len(turn.prompt_ids)
        glue = turn.prompt_ids[consumed[turn.segment] :]
        sample.response_ids += glue + turn.completion_ids
        sample.loss_mask += [0] * len(glue) + [1] * len(turn.completion_ids)
        sample.logprobs += [0.0] * len(glue) + list(turn.logprobs)
        if sample.policy_versions is not None and turn.policy_versions is not None:
            sample.policy_versions += [-1] * len(glue) + list(turn.policy_versions)
        consumed[turn.segment] = len(turn.prompt_ids) + len(turn.completion_ids)
    return [samples[k] for k in sorted(samples)]


def measure_drift(state: RolloutState, samples: list[Sample], renderer: ChatRenderer) -> Drift:
    """Compare the last segment's ids with a fresh render of the final messages."""
    last = samples[-1]
    last_turn = state.last_in_segment(last.segment)
    closing = renderer.encode(renderer.closing_glue(last_turn.completion_ids)) if last_turn else []
    recorded = last.prompt_ids + last.response_ids + closing
    fresh = renderer.transcript_ids(state.messages, state.tools)
    return compare_ids(recorded, fresh)


def compare_ids(recorded: list[int], fresh: list[int]) -> Drift:
    """The drift figure in linear time: the common prefix gives the first mismatch, and the
    common prefix and suffix together bound the differing window (see docs/trajectory.md).
    A full diff would be quadratic on repetitive ids, which a collapsing policy produces."""
    sizes = {"recorded_tokens": len(recorded), "rerendered_tokens": len(fresh)}
    if recorded == fresh:  # the common case, compared in C
        return Drift(**sizes, first_mismatch=None, differing_tokens=0)
    shorter = min(len(recorded), len(fresh))
    prefix = next((i for i in range(shorter) if recorded[i] != fresh[i]), shorter)
    room = shorter - prefix
    suffix = next((i for i in range(room) if recorded[-1 - i] != fresh[-1 - i]), room)
    window = len(recorded) + len(fresh) - 2 * (prefix + suffix)
    return Drift(**sizes, first_mismatch=prefix, differing_tokens=window)


def build_trajectory(state: RolloutState, renderer: ChatRenderer) -> Trajectory:
    samples = build_samples(state.turns) if state.has_token_ids else []
    return Trajectory(
        rollout_id=state.rollout_id,
        model=state.model,
        sampling=state.sampling.to_dict(),
        max_turns=state.max_turns,
        max_seq_len=state.max_seq_len,
        messages=state.messages,
        tools=state.tools,
        turns=state.turns,
        samples=samples,
        is_truncated=state.truncation_reason is not None,
        truncation_reason=state.truncation_reason,
        is_cancelled=state.cut_by_cancel,
        engine_errors=list(state.engine_errors),
        segment_count=state.segment_count,
        drift=measure_drift(state, samples, renderer) if samples else None,
        has_token_ids=state.has_token_ids,
        metadata=state.metadata,
    )
