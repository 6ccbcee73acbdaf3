"""Reasoning apart from the answer: the thinking a model writes between ``<think>`` and
``</think>`` (Qwen3, DeepSeek R1, GLM and their kin) goes back in ``reasoning_content``, as
vLLM's and SGLang's reasoning parsers answer it, and the content is what follows.

The sample keeps every sampled token, thinking included; only the answer's fields are split.
An agent may send an earlier answer back with its reasoning in ``reasoning_content``, inside
``content`` (``<think>...</think>`` first) or not at all: ``sent_reasoning`` reads it from
either place, so the gateway recognises its own answer in each (and an edited reasoning as an
edit).
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN = "<think>"
CLOSE = "</think>"


@dataclass(frozen=True, slots=True)
class ThinkTags:
    """How a template marks reasoning. ``opened_by_prompt``: its generation prompt opens the
    block itself (Qwen3's thinking-only models), so a completion starts inside it."""

    open: str = OPEN
    close: str = CLOSE
    opened_by_prompt: bool = False

    def split(self, text: str) -> tuple[str | None, str]:
        """An answer's ``(reasoning, content)``; reasoning None where the answer has none. An
        answer cut inside its thinking is all reasoning. Newlines around the reasoning and
        before the content are the template's glue (it writes them back itself), not text."""
        body = self._body(text)
        if body is None:
            return None, text
        reasoning, closed, content = body.partition(self.close)
        return reasoning.strip("\n"), content.lstrip("\n") if closed else ""

    def shown(self, text: str) -> str | None:
        """The content of a partial answer, as ``split`` will cut it; None while the answer
        may still be reasoning (so none of it can be shown as content yet)."""
        body = self._body(text)
        if body is None:
            # Text that may yet become the opening tag is held back.
            return None if self.open.startswith(text) else text
        _, closed, content = body.partition(self.close)
        return content.lstrip("\n") if closed else None

    def reasoning_shown(self, text: str) -> str:
        """The reasoning of a partial answer, as ``split`` will cut it, less what more text may
        yet change: a suffix that could begin the closing tag, and trailing newlines."""
        body = self._body(text)
        if body is None:
            return ""
        reasoning, closed, _ = body.partition(self.close)
        if not closed:
            for size in range(min(len(self.close) - 1, len(reasoning)), 0, -1):
                if self.close.startswith(reasoning[-size:]):
                    reasoning = reasoning[:-size]
                    break
        return reasoning.strip("\n")

    def _body(self, text: str) -> str | None:
        if text.startswith(self.open):
            return text[len(self.open) :]
        return text if self.opened_by_prompt else None


def think_tags(chat_template: str, generation_prompt: str) -> ThinkTags | None:
    """The reasoning tags of a template that writes them (None: it has no reasoning)."""
    if OPEN not in chat_template or CLOSE not in chat_template:
        return None
    return ThinkTags(opened_by_prompt=generation_prompt.rstrip().endswith(OPEN))


def sent_reasoning(reasoning: str | None, content: str) -> tuple[str | None, str]:
    """An assistant message's ``(reasoning, content)`` as an agent sent it: the reasoning in
    its ``reasoning_content``, else written before the content (``<think>...</think>``, read
    as the model's templates read it back); None where it has none (absent or empty: dropped).
    """
    if content.startswith(OPEN) and CLOSE in content:
        thought, _, content = content[len(OPEN) :].partition(CLOSE)
        content = content.lstrip("\n")
        reasoning = reasoning or thought.strip("\n")
    return reasoning or None, content
