"""Gemma 3: plain multi-turn chat, no tools.

Gemma 3's template folds the system prompt into the first user turn, writes each message as
``<start_of_turn>ROLE\\n`` + its text (trimmed) + ``<end_of_turn>\\n`` (the assistant's role is
``model``) and refuses any conversation whose roles do not alternate user / assistant, a tool
result included. So a request with tools is refused here, naming why, rather than shown a tool
prompt whose results the template could not take back; a conversation the template refuses
is a request error that says so, never a server error.

A new user question after an answer is written here (checked once against the template on
probe texts): no Jinja run over the conversation per turn.
"""

from __future__ import annotations

from typing import Any

import jinja2

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.template_marks import require_template
from rollway.generation import Message

_PROBES = ("  spaced\n", "{{ x }} {% raw %} 'q' \"d\" <end_of_turn>", "", "émoji ✓\n\nlines")


class Gemma3Renderer(ChatRenderer):
    """Gemma 3 (``base.Renderer``): the template as it is, tools refused."""

    name = "gemma3"

    def __init__(self, tokenizer: Any) -> None:
        require_template(tokenizer, "gemma3", "Gemma", "<start_of_turn> / <end_of_turn> turns")
        super().__init__(tokenizer)
        #: Whether a new question is written here (its text agrees with the template's).
        self._written = all(self._question(p) == self._template_question(p) for p in _PROBES)

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        _refuse_tools(tools)
        try:
            return super().render(messages, None, add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as exc:
            raise InvalidFieldsError(
                f"Gemma 3's chat template refuses these messages: {exc} (it takes a system "
                "prompt first, then user and assistant turns in turn; no tool results)",
                param="messages",
            ) from None

    def continuation_ids(
        self,
        completion_ids: list[int],
        new_messages: list[Message],
        tools: list[dict[str, Any]] | None,
        max_tokens: int | None = None,
        keep_sampled: bool = True,
    ) -> list[int] | None:
        _refuse_tools(tools)
        one = new_messages[0] if len(new_messages) == 1 else None
        if (
            self._written
            and one is not None
            and one["role"] == "user"
            and set(one)
            <= {
                "role",
                "content",
            }
        ):
            text = self._question(self._prepare_one(one)["content"])
            return self.encode(self.closing_glue(completion_ids) + text, max_tokens)
        return super().continuation_ids(
            completion_ids, new_messages, None, max_tokens, keep_sampled
        )

    @staticmethod
    def _question(content: str) -> str:
        return f"<start_of_turn>user\n{content.strip()}<end_of_turn>\n<start_of_turn>model\n"

    def _template_question(self, content: str) -> str | None:
        return self._template_tail([{"role": "user", "content": content}], None, True)


def _refuse_tools(tools: list[dict[str, Any]] | None) -> None:
    if tools:
        raise InvalidFieldsError(
            "Gemma 3 has no tools: its chat template refuses tool results (roles must "
            "alternate user / assistant); ask without tools",
            param="tools",
        )
