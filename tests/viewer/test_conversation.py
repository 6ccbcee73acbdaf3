"""Which turn sampled each assistant message of a conversation: matched from the end on content
and tool calls, so a few-shot example that reads like a later answer is still not sampled."""

from __future__ import annotations

from typing import Any

from rollway.trajectory import Turn
from rollway.viewer.conversation import rebuilt, sampled_by
from tests.trajectories import chain


def turn(index: int, segment: int, prompt: list[int], content: str | None, **more: Any) -> dict:
    return dict(index=index, segment=segment, request_id=f"r{index}", prompt_ids=prompt,
                completion_ids=[50 + index], logprobs=[-0.1], finish_reason="stop",
                content=content, sampling={}, latency_ms=1.0, prompt_hash="0" * 16,
                **more)  # fmt: skip


CALL = {"id": "call_9", "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}  # fmt: skip


def turns() -> list[Turn]:
    return chain([
        turn(0, 0, [1, 2], "5"),
        turn(1, 0, [1, 2, 50, 3], None, tool_calls=[CALL]),
        turn(2, 1, [7], "done"),
    ])  # fmt: skip


def test_a_few_shot_answer_like_a_later_reply_is_not_sampled() -> None:
    messages = [
        {"role": "user", "content": "What is 1 + 4?"},
        {"role": "assistant", "content": "5"},  # the agent's example: the same text as turn 0
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        # An SDK's copy of the call: another id, the arguments parsed, extra fields.
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "x",
                    "type": "function",
                    "index": 0,
                    "function": {"name": "add", "arguments": {"b": 3, "a": 2}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "x", "content": "5"},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    ]
    found = sampled_by(messages, turns())
    assert [t.index if t else None for t in found] == [None, None, None, 0, 1, None, 2]


def test_a_message_unlike_every_turn_is_not_sampled_and_order_is_kept() -> None:
    messages = [
        {"role": "assistant", "content": "done"},  # turn 2's text, but before turn 0's reply
        {"role": "assistant", "content": "5"},
        {"role": "assistant", "content": "made up"},
    ]
    assert [t.index if t else None for t in sampled_by(messages, turns())] == [None, 0, None]


def test_a_segment_rebuilt_without_a_tokenizer_counts_its_ids() -> None:
    early = [t for t in turns() if t.segment == 0]
    parts = rebuilt(early, lambda ids: None)
    assert [(p["kind"], p.get("tokens"), p.get("text")) for p in parts] == [
        ("prompt", 2, None), ("reply", None, None), ("between", 1, None), ("reply", None, None),
    ]  # fmt: skip
    assert parts[3]["message"]["tool_calls"] == [CALL] and parts[1]["turn"] == 0
