"""Model families on their real tokenizers and templates, driven through the gateway by the
scripted engine: the reasoning comes back apart, tool calls parsed, and a tool loop sent back
by an unmodified SDK is one exact sample (every sampled id under mask 1, logprobs aligned)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import Gateway, build_gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.families import Qwen3Renderer
from rollway.gateway.render.renderers import choose_renderer, load_renderer
from rollway.trajectory import Trajectory
from tests.conftest import ADD_TOOL, Closing
from tests.gateway import families_common as common
from tests.gateway.families_common import (
    ANTHROPIC_ADD,
    REASONING,
    Echo,
    Served,
    agent_loop,
    blocks,
    check_thinking_answers,
    in_process_ask,
    in_process_loop,
    serve,
    streamed_message,
    thinking_script,
    tool_results,
    with_reasoning_dropped,
    with_reasoning_field,
    with_reasoning_in_content,
)

__all__ = ["ANTHROPIC_ADD", "REASONING", "Echo", "agent_loop", "streamed_message", "tool_results"]


def qwen3_call(reasoning: str, a: int, b: int) -> str:
    call = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
    return f"<think>\n{reasoning}\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"


def qwen3_answer(reasoning: str, content: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>"


#: Two questions: a 4-turn tool loop, then a 2-turn one after a second user message.
SCRIPT = thinking_script(qwen3_call, qwen3_answer)
FIRST, SECOND = SCRIPT[:4], SCRIPT[4:]


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(qwen3_folder)


@pytest.fixture(scope="module")
def qwen3_renderer(qwen3_tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(qwen3_tokenizer)


def qwen3_gateway(tokenizer: Any, renderer: ChatRenderer) -> tuple[Gateway, ScriptedEngine]:
    return common.scripted_gateway(FIRST + SECOND, tokenizer, renderer, "qwen3")


ECHOES = [with_reasoning_field, with_reasoning_in_content, with_reasoning_dropped]


def check_answers(answers: list[dict[str, Any]]) -> None:
    check_thinking_answers(answers, "<think>")


def check_one_exact_sample(trajectory: Trajectory, engine: ScriptedEngine, tokenizer: Any) -> None:
    common.check_one_exact_sample(trajectory, engine, tokenizer, FIRST + SECOND)


@pytest.mark.parametrize("echo", ECHOES)
def test_qwen3_tool_loop_in_process_is_one_sample(
    qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer, echo: Echo
) -> None:
    gateway, engine = qwen3_gateway(qwen3_tokenizer, qwen3_renderer)
    check_answers(in_process_loop(gateway, "q1", echo))
    check_one_exact_sample(asyncio.run(gateway.trajectory("q1")), engine, qwen3_tokenizer)


@pytest.fixture
def served_qwen3(qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer) -> Iterator[Served]:
    """The HTTP gateway on loopback over a scripted Qwen3."""
    yield from serve(*qwen3_gateway(qwen3_tokenizer, qwen3_renderer))


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_tool_loop_through_the_openai_sdk_is_one_sample(
    served_qwen3: Served, qwen3_tokenizer: Any, closing: Closing, stream: bool
) -> None:
    """As the SDK returned it: reasoning_content is a field it keeps, unknown to it."""
    _, gateway, engine = served_qwen3
    check_answers(common.openai_loop(served_qwen3, closing, "qwen3", stream))
    check_one_exact_sample(asyncio.run(gateway.trajectory("r1")), engine, qwen3_tokenizer)


def test_qwen3_history_as_the_template_renders_it_starts_a_segment_at_a_new_question(
    qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer
) -> None:
    """The per-rollout choice: Qwen3's template keeps an answer's thinking through a tool loop
    (extended) and drops it at a new question (there, a new segment rendered as it does)."""
    gateway, engine = qwen3_gateway(qwen3_tokenizer, qwen3_renderer)
    settings = {"max_tokens": 256, "history": "as_template"}
    check_answers(in_process_loop(gateway, "q1", with_reasoning_field, settings))
    trajectory = asyncio.run(gateway.trajectory("q1"))
    assert [turn.segment for turn in trajectory.turns] == [0, 0, 0, 0, 1, 1]
    # The second segment's prompt is the template's: the first question's thinking is gone.
    second = qwen3_tokenizer.decode(engine.prompts[4])
    assert "Add 1 and 2 first." not in second and "Add 5 to 10." not in second
    assert trajectory.drift is not None and trajectory.drift.differing_tokens == 0


def test_an_unknown_history_choice_is_refused(
    qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer
) -> None:
    gateway, _ = qwen3_gateway(qwen3_tokenizer, qwen3_renderer)
    with pytest.raises(InvalidFieldsError, match="history"):
        gateway.register("q1", {"history": "rerender"})


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_tool_loop_through_the_anthropic_sdk_is_one_sample_with_thinking_blocks(
    served_qwen3: Served, qwen3_tokenizer: Any, closing: Closing, stream: bool
) -> None:
    _, gateway, engine = served_qwen3
    replies = common.anthropic_replies(served_qwen3, closing, "qwen3", stream)
    assert [b.thinking for b in blocks(replies, "thinking")] == REASONING
    assert [b.text for b in blocks(replies, "text")] == ["1 + 2 + 3 + 4 = 10.", "15."]
    check_one_exact_sample(asyncio.run(gateway.trajectory("r1")), engine, qwen3_tokenizer)


def test_qwen3_new_messages_by_shape_are_the_templates_text(qwen3_tokenizer: Any) -> None:
    """A turn's new messages rendered by their shape (placeholders filled) give the ids of a
    Jinja run over the conversation, whatever the contents, tools and history choice."""
    fast, by_template = ChatRenderer(qwen3_tokenizer), ChatRenderer(qwen3_tokenizer)
    by_template._shapes = None
    draw = random.Random(37)
    words = ["42", " spaced ", "\n", "{{x}}", "<tool_response>", "é", "", "</think>", "<|im_end|>"]
    for _ in range(150):
        new: list[dict[str, Any]] = []
        for _ in range(draw.randint(1, 3)):
            role = draw.choice(["tool", "tool", "user", "system"])
            text = "".join(draw.choice(words) for _ in range(draw.randint(0, 5)))
            new.append(
                {"role": role, "content": text} | ({"tool_call_id": "c1"} if role == "tool" else {})
            )
        completion = qwen3_tokenizer.encode(draw.choice(FIRST + SECOND), add_special_tokens=False)
        tools = [ADD_TOOL] if draw.random() < 0.7 else None
        keep = draw.random() < 0.8
        expected = by_template.continuation_ids(completion, new, tools, keep_sampled=keep)
        assert fast.continuation_ids(completion, new, tools, keep_sampled=keep) == expected, new
    assert fast._shapes, "the shapes were not used"


def test_qwen3_shapes_that_disagree_on_a_real_turn_are_dropped(
    qwen3_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    audited, reference = ChatRenderer(qwen3_tokenizer), ChatRenderer(qwen3_tokenizer)
    reference._shapes = None
    new = [{"role": "tool", "tool_call_id": "c1", "content": "3"}]
    completion = qwen3_tokenizer.encode(FIRST[0], add_special_tokens=False)
    audited.continuation_ids(completion, new, [ADD_TOOL])  # the shape is read: audited once
    assert audited._shapes
    (shapes,) = audited._shapes.values()
    shapes._skeletons = {key: (("wrong",), ()) for key in shapes._skeletons}
    audited._continued = 0  # the next one is audited
    with caplog.at_level(logging.WARNING, logger="rollway.gateway.render.chat_template"):
        ids = audited.continuation_ids(completion, new, [ADD_TOOL])
    assert audited._shapes is None and "disagree" in caplog.text
    assert ids == reference.continuation_ids(completion, new, [ADD_TOOL])


def test_the_renderer_is_chosen_from_the_model_folder(
    qwen3_folder: Path, qwen3_tokenizer: Any, renderer: ChatRenderer, tmp_path: Path
) -> None:
    """Qwen3's by its config.json architecture, or by its template where the folder has no
    config.json; SmolLM2's template (no tools, no thinking) gets the Hermes renderer."""
    chosen = load_renderer(qwen3_tokenizer)
    assert isinstance(chosen, Qwen3Renderer) and chosen.name == "qwen3"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_folder / name, tmp_path / name)
    assert choose_renderer(AutoTokenizer.from_pretrained(tmp_path)) == "qwen3"
    assert choose_renderer(renderer.tokenizer) == "hermes"
    assert load_renderer(renderer.tokenizer).name == "hermes"


def test_the_gateway_takes_a_renderer_by_name(qwen3_folder: Path, qwen3_tokenizer: Any) -> None:
    """``rollway gateway --renderer NAME`` (``build_gateway(renderer=...)``) over the folder's
    choice; a name not in the registry is refused naming the choices."""
    engine = ScriptedEngine(FIRST, qwen3_tokenizer)
    assert build_gateway(engine, model=str(qwen3_folder)).renderer.name == "qwen3"
    named = build_gateway(engine, model=str(qwen3_folder), renderer="hermes")
    assert type(named.renderer) is ChatRenderer and named.renderer.name == "hermes"
    with pytest.raises(InvalidFieldsError, match=r"'llama9' is not known; choose one of .*hermes"):
        build_gateway(engine, model=str(qwen3_folder), renderer="llama9")


def test_a_rollout_names_its_own_renderer(
    qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer, renderer: ChatRenderer
) -> None:
    """Registration's ``renderer`` over the gateway's: the rollout's turns are rendered and
    parsed by it (a Qwen3 tool loop under the gateway's Hermes renderer, picked back by the
    rollout, is one sample); a family whose template the model lacks is refused, naming it."""
    hermes = ChatRenderer(qwen3_tokenizer)
    gateway, engine = qwen3_gateway(qwen3_tokenizer, hermes)
    gateway.register("q1", {"max_tokens": 256, "renderer": "qwen3"})
    assert isinstance(gateway.renderer_named("qwen3"), Qwen3Renderer)
    assert gateway.renderer_named("qwen3") is gateway.renderer_named("qwen3")
    check_answers(agent_loop(in_process_ask(gateway, "q1"), with_reasoning_dropped))
    check_one_exact_sample(asyncio.run(gateway.trajectory("q1")), engine, qwen3_tokenizer)
    smol = Gateway(ScriptedEngine([], renderer.tokenizer), renderer, model_name="smol")
    with pytest.raises(InvalidFieldsError, match="is not Qwen3's") as refused:
        smol.register("s1", {"renderer": "qwen3"})
    assert refused.value.param == "renderer"
    with pytest.raises(InvalidFieldsError, match=r"choose one of .*hermes, .*qwen3"):
        smol.register("s2", {"renderer": "llama9"})
