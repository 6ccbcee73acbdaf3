"""What the gateway hands back besides the answer itself (``rollway.generation.ChatResult``): a
rollout's registration, and the answer made without the engine past a limit."""

from __future__ import annotations

from dataclasses import dataclass

from rollway.generation import ChatResult


@dataclass(frozen=True, slots=True)
class Registration:
    rollout_id: str
    api_key: str


def length_answer(prompt_tokens: int = 0) -> ChatResult:
    """The answer to a call past a limit, made without the engine: empty, finish 'length',
    nothing sampled and no turn recorded."""
    return ChatResult({"role": "assistant", "content": ""}, "length", prompt_tokens, 0, [], [])
