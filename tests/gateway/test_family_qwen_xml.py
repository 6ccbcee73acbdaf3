"""Qwen3-Coder (XML tool calls) on the real Qwen3 tokenizer, checked against the ``renderers``
package's reimplementation of its template (``prime-qwen3``: the same ids for the same
messages), and driven through the gateway by the scripted engine: a tool loop sent back by an
unmodified SDK is one exact sample, its calls' values typed by the tools' schemas."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from renderers.prime_qwen3 import PrimeQwen3Renderer
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import Gateway, build_gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.qwen_xml import (
    QWEN3_CODER_TEMPLATE,
    QwenXmlRenderer,
    parse_xml_tool_calls,
)
from rollway.gateway.render.renderers import choose_renderer, load_renderer
from tests.conftest import ADD_TOOL, Closing
from tests.gateway import families_common as common
from tests.gateway.families_common import (
    FOLLOW_UP,
    QUESTION,
    Served,
    agent_loop,
    blocks,
    in_process_ask,
    serve,
)


def coder_calls(*adds: tuple[int, int], content: str = "") -> str:
    """A Qwen3-Coder answer calling ``add`` once per pair, as its template writes calls."""
    blocks = "\n".join(
        f"<tool_call>\n<function=add>\n<parameter=a>\n{a}\n</parameter>\n"
        f"<parameter=b>\n{b}\n</parameter>\n</function>\n</tool_call>"
        for a, b in adds
    )
    return (f"{content}\n\n" if content else "") + blocks + "<|im_end|>"


#: A 4-turn tool loop (text before a call, two calls at once), then a 2-turn one.
SCRIPT = [
    coder_calls((1, 2), content="I will add them in steps."),
    coder_calls((3, 3)),
    coder_calls((6, 4), (10, 0)),
    "1 + 2 + 3 + 4 = 10.<|im_end|>",
    coder_calls((10, 5)),
    "15.<|im_end|>",
]
CALLS = [[(1, 2)], [(3, 3)], [(6, 4), (10, 0)], [], [(10, 5)], []]
CONTENTS = ["I will add them in steps.", "", "", "1 + 2 + 3 + 4 = 10.", "", "15."]


@pytest.fixture(scope="module")
def tokenizer(qwen3_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(qwen3_folder)


@pytest.fixture(scope="module")
def coder(tokenizer: Any) -> QwenXmlRenderer:
    return QwenXmlRenderer(tokenizer)


@pytest.fixture(scope="module")
def reference(tokenizer: Any) -> PrimeQwen3Renderer:
    return PrimeQwen3Renderer(tokenizer)


def the_conversation() -> list[dict[str, Any]]:
    """The whole scripted conversation as OpenAI messages, up to the last answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for turn, (content, calls) in enumerate(zip(CONTENTS, CALLS, strict=True)):
        if turn == len(SCRIPT) - 1:
            return messages
        ids = [f"c{turn}_{n}" for n in range(len(calls))]
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = [
                {
                    "id": i,
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": a, "b": b}},
                }
                for i, (a, b) in zip(ids, calls, strict=True)
            ]
        messages.append(assistant)
        messages += [
            {"role": "tool", "tool_call_id": i, "content": str(a + b)}
            for i, (a, b) in zip(ids, calls, strict=True)
        ]
        if turn == 3:
            messages.append({"role": "user", "content": FOLLOW_UP})
    raise AssertionError("unreachable")


def check_one_exact_sample(
    gateway: Gateway, engine: ScriptedEngine, tokenizer: Any, reference: PrimeQwen3Renderer
) -> None:
    """One segment whose sampled ids are the script's, under mask 1 with the engine's logprobs;
    the last prompt is the reference's render of the whole conversation (the history once)."""
    trajectory = asyncio.run(gateway.trajectory("x1"))
    scripted = common.check_one_exact_sample(trajectory, engine, tokenizer, SCRIPT)
    (sample,) = trajectory.samples
    expected = reference.render_ids(
        the_conversation(), tools=[ADD_TOOL], add_generation_prompt=True
    )
    assert engine.prompts[-1] == expected
    assert sample.prompt_ids + sample.response_ids == expected + scripted[-1]


def check_answers(answers: list[dict[str, Any]]) -> None:
    assert [a.get("content") or "" for a in answers] == CONTENTS
    for answer, calls in zip(answers, CALLS, strict=True):
        called = [json.loads(c["function"]["arguments"]) for c in answer.get("tool_calls") or []]
        # Typed by the tool's schema: integers, not the text "1".
        assert called == [{"a": a, "b": b} for a, b in calls]


def coder_gateway(tokenizer: Any, renderer: ChatRenderer) -> tuple[Gateway, ScriptedEngine, str]:
    """The gateway over the scripted model, its rollout ``x1`` registered (and its key)."""
    gateway, engine = common.scripted_gateway(SCRIPT, tokenizer, renderer, "qwen3-coder")
    return gateway, engine, gateway.register("x1", {"max_tokens": 256}).api_key


def test_renders_are_the_reference_renderers_ids(
    coder: QwenXmlRenderer, reference: PrimeQwen3Renderer
) -> None:
    """System prompt or none, tools or none (with the schema keys the template writes as extra
    tags), calls with text or without, arguments of every kind, tool results grouped."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "  Search the code. ",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "what to find"},
                        "limit": {"type": ["integer", "null"], "minimum": 1, "enum": [5, 10]},
                        "filters": {"type": "object"},
                    },
                    "required": ["query"],
                },
            },
            "strict": True,
        },
        ADD_TOOL,
    ]
    arguments = {"query": "def main", "limit": None, "filters": {"ext": ["py", "é"]}, "x": True}
    history = [
        {"role": "system", "content": "You write code."},
        {"role": "user", "content": "Find main."},
        {
            "role": "assistant",
            "content": "  Searching.  ",
            "tool_calls": [
                {
                    "id": "s1",
                    "type": "function",
                    "function": {"name": "search", "arguments": json.dumps(arguments)},
                },
                {
                    "id": "s2",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "s1", "content": "main.py:3\nlib.py:9"},
        {"role": "tool", "tool_call_id": "s2", "content": "3"},
        {"role": "assistant", "content": "Found it in main.py."},
        {"role": "user", "content": "Thanks <tool_call> {{x}}"},
    ]
    for messages in (history, history[1:], history[1:2]):
        for listed in (tools, None):
            expected = reference.render_ids(
                [dict(m) for m in messages], tools=listed, add_generation_prompt=True
            )
            assert coder.prompt_ids(messages, listed) == expected
            closed = reference.render_ids([dict(m) for m in messages], tools=listed)
            assert coder.transcript_ids(messages, listed) == closed


@pytest.mark.parametrize("echo", ["as returned", "content dropped"])
def test_tool_loop_in_process_is_one_sample(
    tokenizer: Any, coder: QwenXmlRenderer, reference: PrimeQwen3Renderer, echo: str
) -> None:
    gateway, engine, _ = coder_gateway(tokenizer, coder)

    def sent_back(message: dict[str, Any]) -> dict[str, Any]:
        return message if echo == "as returned" else message | {"content": None}

    answers = agent_loop(in_process_ask(gateway, "x1"), sent_back)
    check_answers(answers)
    if echo == "as returned":  # else the text before the first call is not the model's
        check_one_exact_sample(gateway, engine, tokenizer, reference)


@pytest.fixture
def served_coder(tokenizer: Any, coder: QwenXmlRenderer) -> Iterator[Served]:
    yield from serve(*common.scripted_gateway(SCRIPT, tokenizer, coder, "qwen3-coder"))


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_through_the_openai_sdk_is_one_sample(
    served_coder: Served,
    tokenizer: Any,
    reference: PrimeQwen3Renderer,
    closing: Closing,
    stream: bool,
) -> None:
    _, gateway, engine = served_coder
    answers = common.openai_loop(
        served_coder, closing, "qwen3-coder", stream, streamed_message, echo=dict, rollout="x1"
    )
    check_answers(answers)
    check_one_exact_sample(gateway, engine, tokenizer, reference)


def no_call_text(delta: Any) -> None:
    """No delta shows any of a call's text (the stream holds back from ``<tool_call>``), nor
    the newlines the parse drops before it."""
    assert "<" not in (delta.content or "") and "\n" not in (delta.content or "")


def streamed_message(client: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The message gathered from the stream's deltas, each checked."""
    return common.streamed_message(
        client, messages, "qwen3-coder", thinks=False, check_delta=no_call_text
    )


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_through_the_anthropic_sdk_is_one_sample(
    served_coder: Served,
    tokenizer: Any,
    reference: PrimeQwen3Renderer,
    closing: Closing,
    stream: bool,
) -> None:
    _, gateway, engine = served_coder
    replies = common.anthropic_replies(served_coder, closing, "qwen3-coder", stream, "x1")
    assert [b.text for b in blocks(replies, "text")] == [c for c in CONTENTS if c]
    inputs = [[b.input for b in r.content if b.type == "tool_use"] for r in replies]
    assert inputs == [[{"a": a, "b": b} for a, b in calls] for calls in CALLS]
    check_one_exact_sample(gateway, engine, tokenizer, reference)


SCHEMA_TOOL = {
    "type": "function",
    "function": {
        "name": "edit",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "line": {"type": "integer"},
                "scale": {"type": "number"},
                "dry": {"type": "boolean"},
                "patch": {"type": "object"},
                "tags": {"type": "array"},
                "limit": {"type": ["integer", "null"]},
                "width": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "count": {"type": "int"},
            },
        },
    },
}


def edit_call(**values: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function=edit>\n{body}</function>\n</tool_call>"


def test_parameters_are_typed_by_the_tools_schema() -> None:
    """As vLLM's qwen3_coder parser reads them: a string's text as written (one newline each
    side is the template's), numbers, booleans, objects and arrays as JSON, ``null`` as None
    where the type allows more than string; a parameter the tool does not declare is text."""
    text = "Editing.\n\n" + edit_call(
        path="42",
        line="7",
        scale="0.5",
        dry="True",
        patch='{"old": "a", "new": "b"}',
        tags='["x", 1]',
        limit="null",
        width="wide",
        count="3",
        note="two\n  lines ",
    )
    parsed = parse_xml_tool_calls(text, [SCHEMA_TOOL])
    assert parsed.error is None and parsed.content == "Editing."
    (call,) = parsed.tool_calls
    assert call["function"]["name"] == "edit"
    assert json.loads(call["function"]["arguments"]) == {
        "path": "42",
        "line": 7,
        "scale": 0.5,
        "dry": True,
        "patch": {"old": "a", "new": "b"},
        "tags": ["x", 1],
        "limit": None,
        "width": "wide",
        "count": 3,
        "note": "two\n  lines ",
    }
    # Without the tools, every value is the text the model wrote.
    untyped = json.loads(
        parse_xml_tool_calls(edit_call(line="7"), None).tool_calls[0]["function"]["arguments"]
    )
    assert untyped == {"line": "7"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (edit_call(line="seven"), "parameter 'line' is not integer: 'seven'"),
        (edit_call(line="7.5"), "parameter 'line' is not integer"),
        (edit_call(dry="yes"), "parameter 'dry' is not boolean"),
        (edit_call(patch="[1]"), "parameter 'patch' is not object"),
        (edit_call(scale="NaN"), "parameter 'scale' is not number"),
        (edit_call(path="a", line="1")[:-12], "unterminated <tool_call> block"),
        (
            edit_call(line="1", path="a", **{"line ": "2"}).replace("line >", "line>"),
            "'line' twice",
        ),
        (
            "<tool_call>\n<function=edit>\n<parameter=line>\n1\n</function>\n</tool_call>",
            "outside its",
        ),
        ('<tool_call>\n{"name": "edit", "arguments": {}}\n</tool_call>', "not one <function=NAME>"),
        ("<function=edit>\n</function>", "outside <tool_call>"),
    ],
)
def test_a_malformed_call_is_flagged_and_kept_whole(text: str, reason: str) -> None:
    parsed = parse_xml_tool_calls(text, [SCHEMA_TOOL])
    assert parsed.error is not None and reason in parsed.error
    assert parsed.content == text and parsed.tool_calls == []


def test_a_malformed_call_through_the_gateway_is_recorded_with_its_reason(
    tokenizer: Any, coder: QwenXmlRenderer
) -> None:
    bad = "<tool_call>\n<function=add>\n<parameter=a>\none\n</parameter>\n</function>\n</tool_call>"
    engine = ScriptedEngine([bad + "<|im_end|>"], tokenizer)
    gateway = Gateway(engine, coder, model_name="qwen3-coder")
    gateway.register("x1", {"max_tokens": 64})
    body = {"messages": [{"role": "user", "content": QUESTION}], "tools": [ADD_TOOL]}
    message = asyncio.run(gateway.chat("x1", body)).message
    assert message["content"] == bad and not message.get("tool_calls")
    (turn,) = asyncio.run(gateway.trajectory("x1")).turns
    assert turn.tool_call_parse_error == "tool call 'add': parameter 'a' is not integer: 'one'"


def coder_folder(qwen3_folder: Path, folder: Path, template: str | None) -> Path:
    """A Qwen3-Coder model folder: Qwen3's tokenizer, an MoE config and ``template``."""
    shutil.copy(qwen3_folder / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((qwen3_folder / "tokenizer_config.json").read_text())
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    return folder


def test_chosen_from_a_folder_whose_template_writes_xml_calls(
    qwen3_folder: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """Qwen3-Coder shares Qwen3's MoE architecture: its template's ``<function=`` calls (and
    no ``<think>``) choose it, and its own template renders; Qwen3's template in the same
    folder still chooses Qwen3."""
    folder = coder_folder(qwen3_folder, tmp_path, QWEN3_CODER_TEMPLATE + "{#- own -#}")
    own = AutoTokenizer.from_pretrained(folder)
    assert choose_renderer(own) == "qwen3_coder"
    chosen = load_renderer(own)
    assert isinstance(chosen, QwenXmlRenderer) and chosen.tokenizer is own
    assert chosen.thinking is None
    assert build_gateway(ScriptedEngine([], own), model=str(folder)).renderer.name == "qwen3_coder"
    other = tmp_path / "qwen3"
    other.mkdir()
    assert (
        choose_renderer(AutoTokenizer.from_pretrained(coder_folder(qwen3_folder, other, None)))
        == "qwen3"
    )


def test_chosen_by_name_over_the_folders_choice(
    qwen3_folder: Path, tokenizer: Any, renderer: ChatRenderer
) -> None:
    """``--renderer qwen3_coder`` on a Qwen3 folder renders with Qwen3-Coder's template (the
    folder's tokenizer keeps its own), as does a rollout naming it; a tokenizer without Qwen's
    tokens is refused, naming them."""
    named = build_gateway(
        ScriptedEngine([], tokenizer), model=str(qwen3_folder), renderer="qwen3_coder"
    )
    assert isinstance(named.renderer, QwenXmlRenderer)
    assert named.renderer.tokenizer.chat_template == QWEN3_CODER_TEMPLATE
    assert tokenizer.chat_template != QWEN3_CODER_TEMPLATE
    gateway = Gateway(ScriptedEngine(SCRIPT, tokenizer), ChatRenderer(tokenizer), model_name="q")
    gateway.register("x1", {"max_tokens": 256, "renderer": "qwen3_coder"})
    body = {"messages": [{"role": "user", "content": QUESTION}], "tools": [ADD_TOOL]}
    message = asyncio.run(gateway.chat("x1", body)).message
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    smol = Gateway(ScriptedEngine([], renderer.tokenizer), renderer, model_name="smol")
    with pytest.raises(InvalidFieldsError, match="has no <tool_call>") as refused:
        smol.register("s1", {"renderer": "qwen3_coder"})
    assert refused.value.param == "renderer"


def test_new_messages_by_shape_are_the_templates_text(
    tokenizer: Any, coder: QwenXmlRenderer
) -> None:
    """A turn's tool results and questions rendered by their shape give the ids of a Jinja
    run over the conversation."""
    by_template = QwenXmlRenderer(tokenizer)
    by_template._shapes = None
    fast = QwenXmlRenderer(tokenizer)
    completion = tokenizer.encode(SCRIPT[2], add_special_tokens=False)
    for new in (
        [{"role": "tool", "tool_call_id": "c", "content": "10"}],
        [
            {"role": "tool", "tool_call_id": "c", "content": "x"},
            {"role": "tool", "tool_call_id": "d", "content": "{{y}}"},
        ],
        [{"role": "user", "content": "more <tool_call>"}],
    ):
        for tools in ([ADD_TOOL], None):
            expected = by_template.continuation_ids(completion, new, tools)
            assert fast.continuation_ids(completion, new, tools) == expected
    assert fast._shapes
