"""A final assistant message continued, not answered (an Anthropic prefill, vLLM's
``continue_final_message``): the model samples on from the message's text.

The conversation before it is rendered as for any answer, through the generation prompt; the
answer's head follows, as the family's renderer writes the start of a final assistant message
up to the end of its text (Qwen3's template writes an empty ``<think></think>`` there, harmony
the ``final`` channel's header), and the model's tokens continue it. The head is prompt:
template glue and the caller's text, under mask 0 in the sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer, content_text
from rollway.generation import Message


@dataclass(frozen=True, slots=True)
class Prefill:
    #: The conversation before the final message, through the generation prompt.
    asked: str
    #: What follows it: the answer's start, through the final message's text.
    head: str
    #: The final message's text: the answer continues it.
    text: str


def read_prefill(
    renderer: ChatRenderer, messages: list[Message], tools: list[dict[str, Any]] | None
) -> Prefill:
    """The prefill of ``messages``, whose last must be an assistant's text; a 422 naming why
    where it is not, or where the renderer does not write it as the start of an answer."""
    final = messages[-1]
    if final["role"] != "assistant" or final.get("tool_calls") or len(messages) < 2:
        raise InvalidFieldsError(
            "continuing the final message needs an assistant message of text at the end, "
            "after the conversation it answers",
            param="messages",
        )
    text = content_text(final.get("content"))
    if not text:
        raise InvalidFieldsError(
            "the final assistant message to continue is empty", param="messages"
        )
    asked = renderer.render(messages[:-1], tools, add_generation_prompt=True)
    whole = renderer.render(messages, tools, add_generation_prompt=False)
    end = whole.rfind(text)
    if end < 0 or not whole[:end].startswith(asked):
        raise InvalidFieldsError(
            f"the {renderer.name} renderer cannot continue the final assistant message: its "
            "chat template does not write the message's text as it is after the generation "
            "prompt",
            param="messages",
        )
    return Prefill(asked, whole[len(asked) : end + len(text)], text)
