"""Reasoning apart: an answer's thinking split from its content, whole and as it streams, and
the content an earlier answer is recognised by."""

from __future__ import annotations

import itertools

import pytest

from rollway.gateway.render.reasoning import ThinkTags, sent_reasoning, think_tags

QWEN3 = ThinkTags()


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("<think>\nplan\n</think>\n\nanswer", "plan", "answer"),
        ("<think>\n\n</think>\n\nanswer", "", "answer"),
        ("<think>\ncut short by max_tokens", "cut short by max_tokens", ""),
        ("no thinking at all", None, "no thinking at all"),
        ("answer that mentions </think> later", None, "answer that mentions </think> later"),
    ],
)
def test_an_answer_splits_into_reasoning_and_content(
    text: str, reasoning: str | None, content: str
) -> None:
    assert QWEN3.split(text) == (reasoning, content)


def test_a_prompt_that_opens_the_block_makes_the_answer_start_inside_it() -> None:
    opened = ThinkTags(opened_by_prompt=True)
    assert opened.split("plan\n</think>\n\nanswer") == ("plan", "answer")
    assert think_tags("{{ '<think>' }}{{ '</think>' }}", "<|im_start|>assistant\n<think>\n")
    assert think_tags("no tags", "<|im_start|>assistant\n") is None


def test_a_streamed_answer_shows_only_content_and_always_a_prefix_of_it() -> None:
    text = "<think>\nplan\n</think>\n\nthe answer"
    shown = [QWEN3.shown(text[:end]) for end in range(len(text) + 1)]
    visible = [s for s in shown if s is not None]
    assert all(text.endswith(s) or "the answer".startswith(s) for s in visible)
    assert all("think" not in s and "plan" not in s for s in visible)
    assert shown[-1] == "the answer"
    assert QWEN3.shown("<th") is None and QWEN3.shown("plain") == "plain"


def test_streamed_reasoning_is_always_a_prefix_of_the_recorded_one() -> None:
    text = "<think>\nfirst line\nsecond </thin line\n</think>\n\nanswer"
    reasoning, _ = QWEN3.split(text)
    assert reasoning == "first line\nsecond </thin line"
    shown = [QWEN3.reasoning_shown(text[:end]) for end in range(len(text) + 1)]
    assert all(reasoning.startswith(s) for s in shown)
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(shown))
    assert shown[-1] == reasoning


def test_an_answer_sent_back_with_its_reasoning_inside_is_the_same_answer() -> None:
    assert sent_reasoning(None, "<think>\nplan\n</think>\n\nanswer") == ("plan", "answer")
    assert sent_reasoning("plan", "answer") == ("plan", "answer")
    assert sent_reasoning("", "answer") == (None, "answer")  # empty: dropped
    # Only a leading block is reasoning: text that merely mentions the tags is content.
    assert sent_reasoning(None, "see <think>x</think> y") == (None, "see <think>x</think> y")
