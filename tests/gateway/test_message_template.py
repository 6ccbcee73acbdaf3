"""The string-piece shortcut for chat templates gives exactly the template's text and ids, and
is refused for templates it cannot stand in for."""

from __future__ import annotations

import dataclasses
import logging
import random

import jinja2
import pytest

from rollway.gateway.render.chat_template import _BASE, ChatRenderer
from rollway.gateway.render.message_template import read_pieces
from rollway.generation import Message
from tests.conftest import ADD_TOOL, tool_call

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NOT_OF_THIS_SHAPE = {
    "trims content": CHATML.replace("m['content'] }}", "m['content'] | trim }}"),
    "numbers messages": CHATML.replace("{{ m['role'] }}\n", "{{ m['role'] }} {{ loop.index }}\n"),
    "escapes content": CHATML.replace("m['content'] }}", "m['content'] | e }}"),
    "strips reasoning from earlier turns": CHATML.replace(
        "{{ m['content'] }}",
        "{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}",
    ),
    "refuses the tool role": (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ refuse('no') }}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    ),
}


def _jinja(source: str):  # type: ignore[no-untyped-def]
    def fail(message: str) -> None:
        raise ValueError(message)

    template = jinja2.Environment().from_string(source)

    def render(messages: list[Message], add_generation_prompt: bool) -> str:
        return template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, refuse=fail
        )

    return render


def test_a_template_that_only_moves_a_newline_is_still_read_exactly() -> None:
    # The newline between messages is written before the next one instead of after each:
    # the pieces carry it in the prefix, and still give the template's text.
    moved = CHATML.replace(
        "<|im_end|>\n{% endfor %}", "<|im_end|>{% if not loop.last %}\n{% endif %}{% endfor %}"
    )
    pieces = read_pieces(_BASE, _jinja(moved))
    assert pieces is not None and pieces.prefix["user"] == "\n<|im_start|>user\n"


def test_chatml_is_read_into_pieces() -> None:
    pieces = read_pieces(_BASE, _jinja(CHATML))
    assert pieces is not None
    assert pieces.prefix["tool"] == "<|im_start|>tool\n"
    assert pieces.suffix["user"] == "<|im_end|>\n"
    assert pieces.generation_prompt == "<|im_start|>assistant\n"


@pytest.mark.parametrize("why", sorted(NOT_OF_THIS_SHAPE))
def test_templates_the_pieces_cannot_stand_in_for_keep_the_template(why: str) -> None:
    assert read_pieces(_BASE, _jinja(NOT_OF_THIS_SHAPE[why])) is None


def test_continuations_by_pieces_equal_the_templates_own(renderer: ChatRenderer) -> None:
    assert renderer._pieces is not None, "the embedded model's template is ChatML"
    by_template = ChatRenderer(renderer.tokenizer)
    by_template._pieces = None
    by_template._shapes = None
    draw = random.Random(7)
    words = ["42", " spaced ", "\n", "{{x}}", "<tool_call>", "é", "", "a b", "<|im_end|>"]
    checked = 0
    for _ in range(200):
        new: list[Message] = []
        for _ in range(draw.randint(1, 3)):
            role = draw.choice(["tool", "user", "system", "developer"])
            text = "".join(draw.choice(words) for _ in range(draw.randint(0, 6)))
            message: Message = {"role": role, "content": text}
            if role == "tool":
                message["tool_call_id"] = "c1"
            new.append(message)
        if draw.random() < 0.3:
            new.insert(0, {"role": "assistant", "content": None,
                           "tool_calls": [tool_call("c1", 1, 2)]})  # fmt: skip
        completion = renderer.encode(draw.choice(["done", "x<|im_end|>", ""]))
        tools = [ADD_TOOL] if draw.random() < 0.5 else None
        fast = renderer.continuation_ids(completion, new, tools)
        assert fast == by_template.continuation_ids(completion, new, tools), new
        checked += 1
    assert checked == 200


def test_the_rust_tokenizer_encodes_as_transformers_does(renderer: ChatRenderer) -> None:
    texts = [
        "",
        " a",
        "<|im_start|>user\nhi<|im_end|>\n",
        "é✓中文\n\n  x",
        "1+1=2 " * 50,
        "ab " * 5000,
    ]
    for text in texts:
        assert renderer.encode(text) == renderer.tokenizer.encode(text, add_special_tokens=False)


def test_first_prompts_are_cached_but_never_shared(renderer: ChatRenderer) -> None:
    messages = [{"role": "user", "content": "cache me"}]
    first = renderer.prompt_ids(messages, [ADD_TOOL])
    first.append(-1)  # a caller's edit must not reach the next caller
    again = renderer.prompt_ids(messages, [ADD_TOOL])
    assert again == first[:-1]
    assert again == renderer.encode(
        renderer.render(messages, [ADD_TOOL], add_generation_prompt=True)
    )
    from rollway.gateway.render.chat_template import TokenBudgetExceeded

    with pytest.raises(TokenBudgetExceeded):
        renderer.prompt_ids(messages, [ADD_TOOL], max_tokens=len(again) - 1)


def test_pieces_that_disagree_on_a_real_turn_are_dropped(
    renderer: ChatRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    audited = ChatRenderer(renderer.tokenizer)
    assert audited._pieces is not None
    audited._pieces = dataclasses.replace(audited._pieces, generation_prompt="wrong")
    new = [{"role": "tool", "content": "42"}]
    with caplog.at_level(logging.WARNING, logger="rollway.gateway.render.chat_template"):
        ids = audited.continuation_ids([], new, None)
    assert audited._pieces is None and "disagree" in caplog.text
    reference = ChatRenderer(renderer.tokenizer)
    reference._pieces = None
    reference._shapes = None
    assert ids == reference.continuation_ids([], new, None)
