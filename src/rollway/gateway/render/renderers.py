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

#: name -> "module:class" of its renderer.
RENDERERS: dict[str, str] = {
    "hermes": "rollway.gateway.render.chat_template:ChatRenderer",
    "qwen3": "rollway.gateway.render.families:Qwen3Renderer",
    "gpt_oss": "rollway.gateway.render.harmony:GptOssRenderer",
}
#: ``config.json`` architectures whose family has a renderer of its own.
ARCHITECTURES: dict[str, str] = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3",
    "GptOssForCausalLM": "gpt_oss",
}


def renderer_class(name: str) -> type[ChatRenderer]:
    """The class registered as ``name``, imported now."""
    target = RENDERERS.get(name)
    if target is None:
        raise InvalidFieldsError(
            f"renderer {name!r} is not known; choose one of {', '.join(sorted(RENDERERS))}",
            param="renderer",
        )
    module, _, attribute = target.partition(":")
    cls: type[ChatRenderer] = getattr(importlib.import_module(module), attribute)
    return cls


def choose_renderer(tokenizer: Any) -> str:
    """The family of the tokenizer's model folder: its architecture where ``config.json``
    names one with a renderer, else Qwen3 where the template writes tools as Qwen3's does,
    else ``hermes`` (the template as it is, Hermes tool calls)."""
    for architecture in _architectures(Path(str(getattr(tokenizer, "name_or_path", "")))):
        if architecture in ARCHITECTURES:
            return ARCHITECTURES[architecture]
    template = str(tokenizer.chat_template or "")
    if all(mark in template for mark in ("<tool_call>", "<think>", "tools", "<|im_start|>")):
        return "qwen3"
    if all(mark in template for mark in ("<|channel|>", "<|start|>", "<|message|>")):
        return "gpt_oss"
    return "hermes"


def load_renderer(tokenizer: Any, name: str | None = None) -> ChatRenderer:
    """The renderer named ``name``, or the one chosen from the model folder, for ``tokenizer``."""
    return renderer_class(name or choose_renderer(tokenizer))(tokenizer)


def _architectures(folder: Path) -> list[str]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return []  # no folder (a hub name, a test's tokenizer): the template decides
    names = config.get("architectures") if isinstance(config, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else []
