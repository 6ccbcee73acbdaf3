"""Renderers by name: a table of the families, each class loaded only when chosen.

A gateway's renderer is chosen from its model folder (``config.json``'s architecture, then
the template's shape), unless ``rollway gateway --renderer NAME`` names one; a rollout may
name its own at registration (``renderer``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from rollway.errors import InvalidFieldsError
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.template_marks import TEMPLATE_MARKS, refuse_hermes, template_fits

#: name -> "module:class" of its renderer (an unknown name is refused naming these, in order).
RENDERERS: dict[str, str] = {
    "hermes": "rollway.gateway.render.chat_template:ChatRenderer",
    "qwen3": "rollway.gateway.render.families:Qwen3Renderer",
    "qwen3_coder": "rollway.gateway.render.qwen_xml:QwenXmlRenderer",
    "deepseek_v3": "rollway.gateway.render.deepseek:DeepSeekV3Renderer",
    "llama3": "rollway.gateway.render.llama3:Llama3Renderer",
    "gemma3": "rollway.gateway.render.gemma3:Gemma3Renderer",
    "gpt_oss": "rollway.gateway.render.harmony:GptOssRenderer",
}
#: ``config.json`` architectures whose family has a renderer of its own.
ARCHITECTURES: dict[str, str] = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
    "LlamaForCausalLM": "llama3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
}


def renderer_class(name: str) -> type[ChatRenderer]:
    """The class registered as ``name``, imported now."""
    target = RENDERERS.get(name)
    if target is None:
        raise InvalidFieldsError(
            f"renderer {name!r} is not known; choose one of {', '.join(RENDERERS)}",
            param="renderer",
        )
    module, _, attribute = target.partition(":")
    cls: type[ChatRenderer] = getattr(importlib.import_module(module), attribute)
    return cls


def choose_renderer(tokenizer: Any) -> str:
    """The family of the tokenizer's model folder: its architecture where ``config.json``
    names one with a renderer and the template is that family's, else the family whose
    template marks it has, else ``hermes`` (the template as it is, Hermes tool calls)."""
    template = str(tokenizer.chat_template or "")

    def fits(name: str) -> bool:
        return template_fits(template, name)

    for architecture in _architectures(Path(str(getattr(tokenizer, "name_or_path", "")))):
        if architecture in ARCHITECTURES and fits(ARCHITECTURES[architecture]):
            return ARCHITECTURES[architecture]
    return next((name for name in TEMPLATE_MARKS if fits(name)), "hermes")


def load_renderer(tokenizer: Any, name: str | None = None) -> ChatRenderer:
    """The renderer named ``name``, or the one chosen from the model folder, for ``tokenizer``.
    Each family's refuses a template not of its family; ``hermes`` one it cannot serve."""
    chosen = name or choose_renderer(tokenizer)
    if chosen == "hermes":
        refuse_hermes(tokenizer)
    return renderer_class(chosen)(tokenizer)


def _architectures(folder: Path) -> list[str]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return []  # no folder (a hub name, a test's tokenizer): the template decides
    names = config.get("architectures") if isinstance(config, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else []
