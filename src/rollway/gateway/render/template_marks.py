"""What each family's chat template writes: one table for choosing a folder's renderer
(``renderers.choose_renderer``) and for a renderer refusing another family's template."""

from __future__ import annotations

from typing import Any

from rollway.errors import InvalidFieldsError

#: What a family's template writes: its architecture chooses it only where the template has
#: these (SmolLM2 is a LlamaForCausalLM with a ChatML template: ``hermes``), and a folder
#: without config.json by them alone, tried in this order.
TEMPLATE_MARKS: dict[str, tuple[str, ...]] = {
    "qwen3_coder": ("<tool_call>", "<function=", "<|im_start|>"),
    "qwen3": ("<tool_call>", "<think>", "tools", "<|im_start|>"),
    "deepseek_v3": ("<｜tool▁calls▁begin｜>",),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "gemma3": ("<start_of_turn>", "<end_of_turn>", "model"),
    "gpt_oss": ("<|channel|>", "<|start|>", "<|message|>"),
}
#: What a family's template never writes: Qwen3-Coder's and DeepSeek V3's do not think (a
#: template that writes XML calls and thinks is Qwen3.5's, DeepSeek's that thinks R1's).
TEMPLATE_LACKS: dict[str, tuple[str, ...]] = {
    "qwen3_coder": ("<think>",),
    "deepseek_v3": ("<think>",),
}


def template_fits(template: str, name: str) -> bool:
    """Whether ``template`` is family ``name``'s by its marks."""
    return all(mark in template for mark in TEMPLATE_MARKS.get(name, ())) and not any(
        mark in template for mark in TEMPLATE_LACKS.get(name, ())
    )


def require_template(tokenizer: Any, name: str, family: str, writes: str) -> None:
    """Refuse renderer ``name`` over a template that is not ``family``'s (it must write
    ``writes``), rather than render it as another family would."""
    if not template_fits(str(getattr(tokenizer, "chat_template", None) or ""), name):
        raise InvalidFieldsError(
            f"renderer {name!r}: the chat template of {tokenizer.name_or_path!r} is not "
            f"{family}'s (it must write {writes}); {family_hint(tokenizer, name)}",
            param="renderer",
        )


def family_hint(tokenizer: Any, refused: str) -> str:
    """What renderer ``refused``'s refusal suggests: the family whose marks the template has,
    else the renderer of its family or ``hermes`` (the template as it is; never over a
    template ``refuse_hermes`` refuses, which is GPT-OSS's and so has its family)."""
    template = str(getattr(tokenizer, "chat_template", None) or "")
    family = next((name for name in TEMPLATE_MARKS if template_fits(template, name)), None)
    if family is not None and family != refused:
        return f"choose {family!r}, the renderer of its family"
    return "choose the renderer of its family, or 'hermes'"


def refuse_hermes(tokenizer: Any) -> None:
    """Refuse ``hermes`` over a template whose answers are not text: GPT-OSS's harmony writes
    an answer as messages made of special tokens (its channels), which the Hermes parser
    cannot read and the template refuses back in an answer's content."""
    if template_fits(str(getattr(tokenizer, "chat_template", None) or ""), "gpt_oss"):
        raise InvalidFieldsError(
            f"renderer 'hermes': the chat template of {tokenizer.name_or_path!r} is GPT-OSS's "
            "harmony, whose answers are channels of special tokens, not text a Hermes "
            f"renderer reads; {family_hint(tokenizer, 'hermes')}",
            param="renderer",
        )
