"""Gemma 3 on its real tokenizer and template: no tools (the template refuses tool results), and
a plain multi-turn chat sent back by an unmodified SDK is one exact sample."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import build_gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.gemma3 import Gemma3Renderer
from rollway.gateway.render.renderers import choose_renderer, load_renderer
from tests.conftest import ADD_TOOL, Closing, family_folder
from tests.gateway.families_common import Served, scripted_gateway, serve
from tests.gateway.test_family_llama import check_one_exact_sample

QUESTIONS = ["Hi! Who are you?", "  What is 2 + 2?\n", "And {{ 3 }} + 3?", "Thanks, bye."]
ANSWERS = ["I am Gemma.", "2 + 2 = 4.", "3 + 3 = 6.", "Goodbye!"]
SCRIPT = [f"{answer}<end_of_turn>" for answer in ANSWERS]
SYSTEM = {"role": "system", "content": "Answer in one short sentence."}


@pytest.fixture(scope="module")
def gemma_folder() -> Path:
    return family_folder("gemma3")


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(gemma_folder)


@pytest.fixture(scope="module")
def gemma_renderer(gemma_tokenizer: Any) -> Gemma3Renderer:
    return Gemma3Renderer(gemma_tokenizer)


def test_gemma3_renders_as_its_template(
    gemma_renderer: Gemma3Renderer, gemma_tokenizer: Any
) -> None:
    """The system prompt folded into the first user turn, ``model`` turns; a new question
    after an answer is written by the module (no Jinja run), as the template writes it."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for question, answer in zip(QUESTIONS, ANSWERS, strict=True):
        messages.append({"role": "user", "content": question})
        expected = gemma_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert gemma_renderer.prompt_ids(messages, None) == gemma_renderer.encode(expected)
        messages.append({"role": "assistant", "content": answer})
    assert gemma_renderer._written
    answered = gemma_tokenizer.encode(SCRIPT[0], add_special_tokens=False)
    new = [{"role": "user", "content": QUESTIONS[1]}]
    by_template = ChatRenderer(gemma_tokenizer).continuation_ids(answered, new, None)
    assert gemma_renderer.continuation_ids(answered, new, None) == by_template


@pytest.fixture
def served_gemma(gemma_tokenizer: Any, gemma_renderer: Gemma3Renderer) -> Iterator[Served]:
    yield from serve(*scripted_gateway(SCRIPT, gemma_tokenizer, gemma_renderer, "gemma3"))


@pytest.mark.parametrize("stream", [False, True])
def test_gemma3_multi_turn_chat_through_the_openai_sdk_is_one_sample(
    served_gemma: Served,
    gemma_tokenizer: Any,
    closing: Closing,
    stream: bool,
) -> None:
    """Four questions, each after an answer: one sample, no copy of the history."""
    url, gateway, engine = served_gemma
    registered = gateway.register("g1", {"max_tokens": 64})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/g1", api_key=registered.api_key))
    messages: list[dict[str, Any]] = [SYSTEM]
    answers = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        if stream:
            chunks = client.chat.completions.create(model="gemma3", messages=messages, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = client.chat.completions.create(model="gemma3", messages=messages)
            text = reply.choices[0].message.content or ""
        answers.append(text)
        messages.append({"role": "assistant", "content": text})
    assert answers == ANSWERS
    trajectory = asyncio.run(gateway.trajectory("g1"))
    check_one_exact_sample(trajectory, engine, gemma_tokenizer, SCRIPT)
    assert trajectory.drift is not None and trajectory.drift.differing_tokens == 0


def test_gemma3_refuses_tools_with_a_clear_error(served_gemma: Served, closing: Closing) -> None:
    """Its template takes no tool results: a request with tools is a 422 naming why, and a
    conversation the template refuses (roles out of turn) a 422 too, never a server error."""
    url, gateway, _ = served_gemma
    registered = gateway.register("g1", {"max_tokens": 64})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/g1", api_key=registered.api_key))
    asked = [{"role": "user", "content": "What is 1 + 2?"}]
    with pytest.raises(openai.UnprocessableEntityError, match="Gemma 3 has no tools"):
        client.chat.completions.create(model="gemma3", messages=asked, tools=[ADD_TOOL])
    twice = [*asked, {"role": "user", "content": "Again?"}]
    with pytest.raises(openai.UnprocessableEntityError, match="roles must alternate"):
        client.chat.completions.create(model="gemma3", messages=twice)


def test_gemma3_is_chosen_from_the_model_folder_and_by_name(
    gemma_folder: Path, gemma_tokenizer: Any, renderer: ChatRenderer, tmp_path: Path
) -> None:
    """By its template (the folder as fetched has no config.json), by config.json's
    architecture where the template is Gemma's, and by name."""
    assert choose_renderer(gemma_tokenizer) == "gemma3"
    config = {"architectures": ["Gemma3ForConditionalGeneration"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for template, chosen in ((gemma_tokenizer.chat_template, "gemma3"), ("{{ x }}", "hermes")):
        folder = SimpleNamespace(name_or_path=str(tmp_path), chat_template=template)
        assert choose_renderer(folder) == chosen
    engine = ScriptedEngine(SCRIPT, gemma_tokenizer)
    assert build_gateway(engine, model=str(gemma_folder)).renderer.name == "gemma3"
    assert isinstance(load_renderer(gemma_tokenizer, "gemma3"), Gemma3Renderer)
    with pytest.raises(InvalidFieldsError, match="is not Gemma's"):
        Gemma3Renderer(renderer.tokenizer)
