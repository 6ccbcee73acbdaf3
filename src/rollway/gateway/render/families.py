"""Renderers of the model families beyond the template-driven Hermes one (``registry``)."""

from __future__ import annotations

from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.template_marks import family_hint


class Qwen3Renderer(ChatRenderer):
    """Qwen3: the template writes the tools and earlier calls itself, calls are Hermes-shaped
    ``<tool_call>`` blocks, and the reasoning between ``<think>`` and ``</think>`` comes back
    apart. Refused on a template that is not of that shape, rather than rendering as another
    family would."""

    name = "qwen3"

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        template = str(tokenizer.chat_template)
        if not self.native_tools or self.thinking is None or self.tool_call_open not in template:
            raise InvalidFieldsError(
                f"renderer 'qwen3': the chat template of {tokenizer.name_or_path!r} is not "
                "Qwen3's (it must write tools, <tool_call> blocks and <think> reasoning); "
                f"{family_hint(tokenizer, 'qwen3')}",
                param="renderer",
            )
