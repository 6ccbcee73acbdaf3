"""First prompts by pieces (``render/prefix_cache.py``): a system prompt and tools that many
tasks share are tokenized once, and the ids are always those of the whole render."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from tokenizers import AddedToken
from transformers import AutoTokenizer

from rollway.gateway.render.chat_template import AUDIT_EVERY, ChatRenderer
from rollway.gateway.render.families import Qwen3Renderer
from rollway.gateway.render.prefix_cache import PieceIds
from rollway.model_folders import resolve_model_path
from tests.conftest import ADD_TOOL, family_folder

SYSTEM = "You are a careful agent. Look things up before you answer.\n" * 40
TOOLS = [
    ADD_TOOL,
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Looks a fact up in the encyclopedia. " * 20,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    },
]


@pytest.fixture(scope="module")
def smollm2() -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path()))


@pytest.fixture(scope="module")
def qwen3(qwen3_folder: Path) -> ChatRenderer:
    return Qwen3Renderer(AutoTokenizer.from_pretrained(qwen3_folder))


def task(question: str, *more: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}, *more]


def whole(renderer: ChatRenderer, messages: list[dict[str, Any]], tools: Any) -> list[int]:
    return renderer.encode(renderer.render(messages, tools, add_generation_prompt=True))


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_tasks_sharing_a_system_prompt_and_tools_tokenize_only_their_question(
    name: str, request: pytest.FixtureRequest
) -> None:
    renderer: ChatRenderer = request.getfixturevalue(name)
    pieces = renderer.prompt_pieces
    assert pieces is not None
    first = task("What is 2 + 2?")
    assert renderer.prompt_ids(first, TOOLS) == whole(renderer, first, TOOLS)
    before = pieces.encoded_chars
    second = task("Who wrote Hamlet?")
    ids = renderer.prompt_ids(second, TOOLS)
    assert ids == whole(renderer, second, TOOLS)
    rendered = renderer.render(second, TOOLS, add_generation_prompt=True)
    # Only the question's piece is new: its role header and text, not the 2k shared tokens.
    assert pieces.encoded_chars - before == len("<|im_start|>user\nWho wrote Hamlet?")
    assert len(rendered) > 2000


def test_the_qwen3_template_with_tools_and_a_tool_loop_by_pieces_is_its_own_ids(
    qwen3: ChatRenderer, qwen3_folder: Path
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    messages = task(
        "Add.",
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "3", "tool_call_id": "c1"},
    )
    tokenizer = AutoTokenizer.from_pretrained(qwen3_folder)
    expected = tokenizer.apply_chat_template(
        qwen3._prepare(messages, TOOLS), tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert qwen3.prompt_ids(messages, TOOLS) == tokenizer.encode(expected, add_special_tokens=False)


#: Texts that sit against a cut: whitespace, newlines, special tokens and their parts written
#: as text, letters that a BPE would merge across, and characters that normalize.
EDGE = st.sampled_from(
    ["", " ", "\n", "\n\n", "  ", "a", "é", "e\u0301", "<|im_end|>", "<|im_start|>", "<|im_",
     "|>", "<think>", "<tool_call>", "</tool_call>", "<|endoftext|>", "'s", "123", "\t", "🙂"]
)  # fmt: skip
TEXT = st.lists(st.one_of(EDGE, st.text(max_size=6)), max_size=8).map("".join)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": TEXT}
)


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_prompts_by_pieces_equal_the_whole_render_on_any_messages(
    name: str, request: pytest.FixtureRequest
) -> None:
    renderer: ChatRenderer = request.getfixturevalue(name)
    assert renderer.prompt_pieces is not None

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        messages=st.lists(MESSAGE, min_size=1, max_size=5),
        tools=st.sampled_from([None, TOOLS]),
    )
    def check(messages: list[dict[str, Any]], tools: Any) -> None:
        if messages[-1]["role"] == "assistant":
            messages.append({"role": "user", "content": "?"})
        text = renderer.render(messages, tools, add_generation_prompt=True)
        assert renderer.prompt_pieces is not None
        assert "".join(renderer.prompt_pieces.split(text)) == text
        assert renderer.prompt_ids(messages, tools) == renderer.encode(text)
        assert renderer.prompt_pieces.ids(text) == renderer.encode(text)  # now from the cache

    check()
    assert renderer.prompt_pieces is not None  # no audit disagreed


#: A system prompt and alternating turns ending in a question: what every template takes.
ALTERNATING = st.tuples(st.one_of(st.none(), TEXT), st.lists(TEXT, min_size=0, max_size=4)).map(
    lambda drawn: [
        *([{"role": "system", "content": drawn[0]}] if drawn[0] is not None else []),
        *[
            {"role": "assistant" if at % 2 else "user", "content": text}
            for at, text in enumerate([*drawn[1], "?"] if len(drawn[1]) % 2 == 0 else drawn[1])
        ],
    ]
)


@pytest.mark.parametrize("name", ["deepseek_v3", "gemma3", "llama3_1"])
def test_other_families_prompts_by_pieces_equal_the_whole_render(name: str) -> None:
    """Their cuts differ: DeepSeek's turn markers are added tokens matched in the normalized
    text (its normalizer changes nothing), Gemma's runs of newlines are added tokens."""
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(family_folder(name)))
    assert renderer.prompt_pieces is not None

    @settings(
        max_examples=60,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(messages=ALTERNATING)
    def check(messages: list[dict[str, Any]]) -> None:
        text = renderer.render(messages, None, add_generation_prompt=True)
        assert renderer.prompt_ids(messages, None) == renderer.encode(text)

    check()
    assert renderer.prompt_pieces is not None


def test_a_wrong_cached_piece_is_caught_by_the_audit_and_the_pieces_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path()))
    pieces = renderer.prompt_pieces
    assert pieces is not None
    first = task("What is 2 + 2?")
    renderer.prompt_ids(first, TOOLS)
    system_piece = pieces.split(renderer.render(first, TOOLS, add_generation_prompt=True))[0]
    pieces._kept[system_piece] = [0, 1, 2]  # a wrong cache
    for at in range(AUDIT_EVERY):
        messages = task(f"Question {at}?")
        with caplog.at_level(logging.WARNING):
            ids = renderer.prompt_ids(messages, TOOLS)
        if renderer.prompt_pieces is None:
            break
    assert renderer.prompt_pieces is None
    assert ids == whole(renderer, messages, TOOLS)
    assert "disagree with the whole text's" in caplog.text
    # From then on the whole text is encoded, and the prompts made by pieces before the
    # audit are not served from the first prompts' cache.
    for later in (task("Later?"), task("Question 0?")):
        assert renderer.prompt_ids(later, TOOLS) == whole(renderer, later, TOOLS)


def test_a_token_that_takes_the_whitespace_before_it_is_not_cut_before() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path())
    tokenizer.add_special_tokens({"additional_special_tokens": [AddedToken("<sep>", lstrip=True)]})
    pieces = PieceIds.for_tokenizer(
        tokenizer, lambda texts: [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    )
    assert pieces is not None
    text = "a <sep> b<|im_end|>\nc"
    assert pieces.split(text) == ["a <sep> b", "<|im_end|>\nc"]
    assert pieces.ids(text) == tokenizer.encode(text, add_special_tokens=False)


def test_a_tokenizer_whose_pieces_do_not_encode_as_the_whole_gets_no_cache() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path())

    def merging(texts: list[str]) -> list[list[int]]:  # as if the BPE merged across a cut
        return [[len(text)] for text in texts]

    assert PieceIds.for_tokenizer(tokenizer, merging) is None


def test_deepseeks_question_is_a_piece_of_its_own_apart_from_the_system_prompt() -> None:
    """Its turn markers are not special and are matched in the normalized text, which its
    (empty) normalizer leaves as it is: they cut, so a shared system prompt is a piece."""
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(family_folder("deepseek_v3")))
    assert renderer.prompt_pieces is not None
    messages = task("What is 2 + 2?")
    text = renderer.render(messages, None, add_generation_prompt=True)
    pieces = renderer.prompt_pieces.split(text)
    assert pieces[0].endswith(SYSTEM) and pieces[1] == "<\uff5cUser\uff5c>What is 2 + 2?"
