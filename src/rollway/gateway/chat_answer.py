"""What one chat call gives back, whichever turn strategy answered it."""

from __future__ import annotations

from dataclasses import dataclass

from rollway.gateway.chat_template import Message


@dataclass(frozen=True, slots=True)
class Registration:
    rollout_id: str
    api_key: str


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One answered chat call: the assistant message and what the HTTP layer reports."""

    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    completion_ids: list[int]
    logprobs: list[float]
    turn_index: int | None


def length_answer(prompt_tokens: int = 0) -> ChatResult:
    """The answer to a call past a limit, made without the engine: empty, finish 'length'."""
    return ChatResult(
        {"role": "assistant", "content": ""}, "length", prompt_tokens, 0, [], [], None
    )
