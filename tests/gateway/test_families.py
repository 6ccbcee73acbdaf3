"""Model families on their real tokenizers and templates, driven through the gateway by the
scripted engine: the reasoning comes back apart, tool calls parsed, and a tool loop sent back
by an unmodified SDK is one exact sample (every sampled id under mask 1, logprobs aligned)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import Gateway, build_gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.families import Qwen3Renderer
from rollway.gateway.render.renderers import choose_renderer, load_renderer
from rollway.trajectory import Trajectory
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, Closing

Echo = Callable[[dict[str, Any]], dict[str, Any]]


def qwen3_call(reasoning: str, a: int, b: int) -> str:
    call = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
    return f"<think>\n{reasoning}\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"


def qwen3_answer(reasoning: str, content: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>"


#: Two questions: a 4-turn tool loop, then a 2-turn one after a second user message.
FIRST = [
    qwen3_call("Add 1 and 2 first.", 1, 2),
    qwen3_call("Now 3 and 3.", 3, 3),
    qwen3_call("Then 6 and 4.", 6, 4),
    qwen3_answer("The sum is 10.", "1 + 2 + 3 + 4 = 10."),
]
SECOND = [qwen3_call("Add 5 to 10.", 10, 5), qwen3_answer("It is 15.", "15.")]
REASONING = [
    "Add 1 and 2 first.",
    "Now 3 and 3.",
    "Then 6 and 4.",
    "The sum is 10.",
    "Add 5 to 10.",
    "It is 15.",
]


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen3_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(qwen3_folder)


@pytest.fixture(scope="module")
def qwen3_renderer(qwen3_tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(qwen3_tokenizer)


def qwen3_gateway(tokenizer: Any, renderer: ChatRenderer) -> tuple[Gateway, ScriptedEngine]:
    engine = ScriptedEngine(FIRST + SECOND, tokenizer)
    return Gateway(engine, renderer, model_name="qwen3"), engine


def with_reasoning_field(message: dict[str, Any]) -> dict[str, Any]:
    return message


def with_reasoning_in_content(message: dict[str, Any]) -> dict[str, Any]:
    reasoning, content = message.pop("reasoning_content"), message.get("content") or ""
    return message | {"content": f"<think>\n{reasoning}\n</think>\n\n{content}"}


def with_reasoning_dropped(message: dict[str, Any]) -> dict[str, Any]:
    message.pop("reasoning_content")
    return message


ECHOES = [with_reasoning_field, with_reasoning_in_content, with_reasoning_dropped]


def tool_results(message: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"])
        total = str(arguments["a"] + arguments["b"])
        results.append({"role": "tool", "tool_call_id": call["id"], "content": total})
    return results


def agent_loop(ask: Callable[[list[dict[str, Any]]], dict[str, Any]], echo: Echo) -> list[Any]:
    """Two questions, each answered through a tool loop; every answer sent back by ``echo``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 1 + 2 + 3 + 4?"}]
    answers = []
    for turns, follow_up in ((4, "And plus 5?"), (2, None)):
        for _ in range(turns):
            answer = ask(messages)
            answers.append(dict(answer))
            messages += [echo(dict(answer)), *tool_results(answer)]
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return answers


def check_answers(answers: list[dict[str, Any]]) -> None:
    assert [a.get("reasoning_content") for a in answers] == REASONING
    for answer in answers:
        assert "<think>" not in (answer.get("content") or "")
    calls = [json.loads(a["tool_calls"][0]["function"]["arguments"]) for a in answers[:3]]
    assert calls == [{"a": 1, "b": 2}, {"a": 3, "b": 3}, {"a": 6, "b": 4}]
    assert answers[3]["content"] == "1 + 2 + 3 + 4 = 10." and not answers[3].get("tool_calls")
    assert answers[5]["content"] == "15."


def check_one_exact_sample(trajectory: Trajectory, engine: ScriptedEngine, tokenizer: Any) -> None:
    """One segment; the sampled ids are exactly the script's, under mask 1, with the engine's
    logprobs beside them; each prompt extends the previous prompt and completion."""
    assert trajectory.segment_count == 1
    (sample,) = trajectory.samples
    sampled = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
    scripted = [tokenizer.encode(text, add_special_tokens=False) for text in FIRST + SECOND]
    assert sampled == [token for ids in scripted for token in ids]
    logprobs = [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m]
    assert logprobs == [-0.001 * rank for rank in range(1, len(sampled) + 1)]
    for turn, (prompt, ids) in enumerate(zip(engine.prompts[1:], scripted, strict=False)):
        before = engine.prompts[turn]
        assert prompt[: len(before) + len(ids)] == before + ids, f"turn {turn + 1}"


@pytest.mark.parametrize("echo", ECHOES)
def test_qwen3_tool_loop_in_process_is_one_sample(
    qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer, echo: Echo
) -> None:
    gateway, engine = qwen3_gateway(qwen3_tokenizer, qwen3_renderer)
    gateway.register("q1", {"max_tokens": 256})

    def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"messages": messages, "tools": [ADD_TOOL]}
        return dict(asyncio.run(gateway.chat("q1", body)).message)

    check_answers(agent_loop(ask, echo))
    check_one_exact_sample(asyncio.run(gateway.trajectory("q1")), engine, qwen3_tokenizer)


@pytest.fixture
def served_qwen3(
    qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer
) -> Iterator[tuple[str, Gateway, ScriptedEngine]]:
    """The HTTP gateway on loopback over a scripted Qwen3."""
    gateway, engine = qwen3_gateway(qwen3_tokenizer, qwen3_renderer)
    with BackgroundServer(create_app(gateway, admin_key=f"ak-{secrets.token_hex(8)}")) as url:
        yield url, gateway, engine


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_tool_loop_through_the_openai_sdk_is_one_sample(
    served_qwen3: tuple[str, Gateway, ScriptedEngine],
    qwen3_tokenizer: Any,
    closing: Closing,
    stream: bool,
) -> None:
    url, gateway, engine = served_qwen3
    registered = gateway.register("q1", {"max_tokens": 256})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/q1", api_key=registered.api_key))

    def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not stream:
            reply = client.chat.completions.create(
                model="qwen3", messages=messages, tools=[ADD_TOOL]
            )
            # As the SDK returned it: reasoning_content is a field it keeps, unknown to it.
            return reply.choices[0].message.model_dump(exclude_none=True)
        return streamed_message(client, messages)

    check_answers(agent_loop(ask, with_reasoning_field))
    check_one_exact_sample(asyncio.run(gateway.trajectory("q1")), engine, qwen3_tokenizer)


def streamed_message(client: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The message an SDK user gathers from the stream's deltas; the reasoning streams as the
    tokens come (a delta a token here: the scripted engine streams so), before any content."""
    content, reasoning, calls, kinds = "", "", [], []
    chunks = client.chat.completions.create(
        model="qwen3", messages=messages, tools=[ADD_TOOL], stream=True
    )
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        thought = (delta.model_extra or {}).get("reasoning_content")
        kinds += ["content"] * bool(delta.content) + ["reasoning"] * bool(thought)
        content += delta.content or ""
        reasoning += thought or ""
        calls += [call.model_dump(exclude_none=True) for call in delta.tool_calls or []]
    assert kinds.count("reasoning") > 1
    assert "content" not in kinds or kinds.index("content") > max(
        at for at, kind in enumerate(kinds) if kind == "reasoning"
    )
    for call in calls:
        call.pop("index")
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def test_qwen3_history_as_the_template_renders_it_starts_a_segment_at_a_new_question(
    qwen3_tokenizer: Any, qwen3_renderer: ChatRenderer
) -> None:
    """The per-rollout choice: Qwen3's template keeps an answer's thinking through a tool loop
    (extended) and drops it at a new question (there, a new segment rendered as it does)."""
    gateway, engine = qwen3_gateway(qwen3_tokenizer, qwen3_renderer)
    gateway.register("q1", {"max_tokens": 256, "history": "as_template"})

    def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"messages": messages, "tools": [ADD_TOOL]}
        return dict(asyncio.run(gateway.chat("q1", body)).message)

    check_answers(agent_loop(ask, with_reasoning_field))
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


ANTHROPIC_ADD = {
    "name": "add",
    "description": ADD_TOOL["function"]["description"],
    "input_schema": ADD_TOOL["function"]["parameters"],
}


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_tool_loop_through_the_anthropic_sdk_is_one_sample_with_thinking_blocks(
    served_qwen3: tuple[str, Gateway, ScriptedEngine],
    qwen3_tokenizer: Any,
    closing: Closing,
    stream: bool,
) -> None:
    url, gateway, engine = served_qwen3
    registered = gateway.register("q1", {"max_tokens": 256})
    client = closing(
        anthropic.Anthropic(base_url=f"{url}/v1/rollouts/q1", api_key=registered.api_key)
    )

    def ask(messages: list[dict[str, Any]]) -> Any:
        asked = {"model": "qwen3", "max_tokens": 256, "messages": messages}
        if not stream:
            return client.messages.create(**asked, tools=[ANTHROPIC_ADD])
        with client.messages.stream(**asked, tools=[ANTHROPIC_ADD]) as events:
            return events.get_final_message()

    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 1 + 2 + 3 + 4?"}]
    thoughts, texts = [], []
    for turns, follow_up in ((4, "And plus 5?"), (2, None)):
        for _ in range(turns):
            reply = ask(messages)
            thoughts += [b.thinking for b in reply.content if b.type == "thinking"]
            texts += [b.text for b in reply.content if b.type == "text"]
            # Sent back as the SDK returned it: thinking block first, with its signature.
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": str(sum(b.input.values()))}
                for b in reply.content
                if b.type == "tool_use"
            ]
            if results:
                messages.append({"role": "user", "content": results})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    assert thoughts == REASONING
    assert texts == ["1 + 2 + 3 + 4 = 10.", "15."]
    check_one_exact_sample(asyncio.run(gateway.trajectory("q1")), engine, qwen3_tokenizer)


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
    with pytest.raises(InvalidFieldsError, match="'llama9' is not known; choose one of .*hermes"):
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

    def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"messages": messages, "tools": [ADD_TOOL]}
        return dict(asyncio.run(gateway.chat("q1", body)).message)

    check_answers(agent_loop(ask, with_reasoning_dropped))
    check_one_exact_sample(asyncio.run(gateway.trajectory("q1")), engine, qwen3_tokenizer)
    smol = Gateway(ScriptedEngine([], renderer.tokenizer), renderer, model_name="smol")
    with pytest.raises(InvalidFieldsError, match="is not Qwen3's") as refused:
        smol.register("s1", {"renderer": "qwen3"})
    assert refused.value.param == "renderer"
    with pytest.raises(InvalidFieldsError, match="choose one of .*hermes, .*qwen3"):
        smol.register("s2", {"renderer": "llama9"})
