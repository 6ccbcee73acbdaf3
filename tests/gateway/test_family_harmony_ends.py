"""GPT-OSS answers harmony does not allow, driven through the gateway by the scripted engine on
the real tokenizer: flagged (the text kept whole, the turn's parse error set), never passed on as
content with harmony's markup in it. The stop token the model sampled says how the answer's
last message may end: a call at ``<|call|>``, anything else at ``<|return|>``."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from rollway.engines.scripted import ScriptedEngine
from rollway.gateway import Gateway
from rollway.gateway.render.renderers import load_renderer
from tests.conftest import ADD_TOOL
from tests.gateway.test_family_edits import tokenizer

CALL = '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}'


@functools.cache
def renderer() -> Any:
    return load_renderer(tokenizer("gptoss"), None)


def answered(completion: str) -> tuple[dict[str, Any], str | None]:
    """The message the gateway answers for ``completion``, and its turn's parse error."""
    engine = ScriptedEngine([completion], tokenizer("gptoss"))
    gateway = Gateway(engine, renderer(), model_name="g")
    gateway.register("r", {"max_tokens": 64})
    body = {"messages": [{"role": "user", "content": "Add."}], "tools": [ADD_TOOL]}
    result = asyncio.run(gateway.chat("r", body))
    (turn,) = asyncio.run(gateway.trajectory("r")).turns
    return dict(result.message), turn.tool_call_parse_error


@pytest.mark.parametrize(
    ("completion", "error"),
    [
        ("<|channel|><|channel|><|channel|><|return|>", "header without <|message|>"),
        (
            "<|channel|>analysis<|message|>t<|end|><|start|>assistant<|channel|>final<|return|>",
            "header without <|message|>",
        ),
        ("Just text.<|return|>", "header without <|message|>"),
        (CALL + "<|return|>", "a tool call ended by <|return|>"),
        ("<|channel|>final<|message|>done<|call|>", "'final', not a tool call, ended by <|call|>"),
    ],
)
def test_a_misshapen_or_misended_answer_is_flagged(completion: str, error: str) -> None:
    message, flagged = answered(completion)
    assert flagged is not None and error in flagged
    text = completion.removesuffix("<|return|>").removesuffix("<|call|>")
    assert message["content"] == text and not message.get("tool_calls")


def test_text_with_no_header_cut_short_is_flagged_too() -> None:
    """harmony's parser (vLLM's) reads text before any ``<|message|>`` as a header and
    answers nothing; the gateway keeps the text and says why."""
    parsed = renderer().parse("Just text.", use_tools=True)
    assert parsed.content == "Just text." and "no harmony message" in (parsed.error or "")


@pytest.mark.parametrize(
    "completion",
    [
        CALL + "<|call|>",
        "<|channel|>final<|message|>done<|return|>",
        "<|channel|>analysis<|message|>t<|end|><|return|>",
        f"{CALL}<|end|><|start|>assistant{CALL}<|call|>",
    ],
)
def test_a_well_ended_answer_is_not_flagged(completion: str) -> None:
    _, flagged = answered(completion)
    assert flagged is None


def test_a_call_to_an_undeclared_tool_is_answered_as_other_families_do() -> None:
    """As the Hermes parsers (rollway's and vLLM's) do: the name is the model's to choose."""
    message, flagged = answered(CALL.replace("functions.add", "functions.nope") + "<|call|>")
    assert flagged is None and message["tool_calls"][0]["function"]["name"] == "nope"
