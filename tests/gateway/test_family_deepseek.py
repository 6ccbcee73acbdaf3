"""DeepSeek V3 on its real tokenizer and template: renders equal to the template where it is
well formed and to the ``renderers`` package's reference, its calls parsed (a malformed one
flagged), and a tool loop driven by an unmodified SDK one exact sample."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from renderers.deepseek_v3 import DeepSeekV3Renderer as ReferenceRenderer
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import Gateway, build_gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.deepseek import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    OUTPUT_BEGIN,
    SEP,
    DeepSeekV3Renderer,
    parse_deepseek_calls,
)
from rollway.gateway.render.renderers import choose_renderer, load_renderer
from rollway.trajectory import Trajectory
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, Closing
from tests.gateway import families_common as common
from tests.gateway.families_common import (
    Served,
    agent_loop,
    blocks,
    in_process_ask,
    in_process_loop,
    serve,
)

EOS = "<｜end▁of▁sentence｜>"


def call_block(a: int, b: int) -> str:
    arguments = json.dumps({"a": a, "b": b})
    return f"{CALL_BEGIN}function{SEP}add\n```json\n{arguments}\n```{CALL_END}"


def ds_calls(*pairs: tuple[int, int], before: str = "") -> str:
    """An answer calling ``add`` once per pair, as the model writes it (calls a line apart)."""
    return before + CALLS_BEGIN + "\n".join(call_block(a, b) for a, b in pairs) + CALLS_END + EOS


#: Two questions: a 4-turn tool loop (text before its first call), then a 2-turn one after a
#: second user message whose first turn calls twice at once.
FIRST = [
    ds_calls((1, 2), before="I will add them.\n\n"),
    ds_calls((3, 3)),
    ds_calls((6, 4)),
    "1 + 2 + 3 + 4 = 10." + EOS,
]
SECOND = [ds_calls((10, 5), (5, 10)), "15." + EOS]
SCRIPT = FIRST + SECOND
CALLS = [[(1, 2)], [(3, 3)], [(6, 4)], [], [(10, 5), (5, 10)], []]
CONTENTS = ["I will add them.\n\n", "", "", "1 + 2 + 3 + 4 = 10.", "", "15."]


@pytest.fixture(scope="module")
def ds_tokenizer(deepseek_v3_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(deepseek_v3_folder)


@pytest.fixture(scope="module")
def ds_renderer(ds_tokenizer: Any) -> DeepSeekV3Renderer:
    return DeepSeekV3Renderer(ds_tokenizer)


@pytest.fixture(scope="module")
def reference(ds_tokenizer: Any) -> ReferenceRenderer:
    return ReferenceRenderer(ds_tokenizer)


def ds_gateway(tokenizer: Any, renderer: ChatRenderer) -> tuple[Gateway, ScriptedEngine]:
    return common.scripted_gateway(SCRIPT, tokenizer, renderer, "deepseek")


def as_returned(message: dict[str, Any]) -> dict[str, Any]:
    return message


def check_answers(answers: list[dict[str, Any]]) -> None:
    """Calls in ``tool_calls`` (arguments as sampled), content without markers, no reasoning."""
    calls = [
        [tuple(json.loads(c["function"]["arguments"]).values()) for c in a.get("tool_calls") or []]
        for a in answers
    ]
    assert calls == CALLS
    assert [a.get("content") or "" for a in answers] == CONTENTS
    assert not any(a.get("reasoning_content") for a in answers)


def check_one_exact_sample(trajectory: Trajectory, engine: ScriptedEngine, tokenizer: Any) -> None:
    """One segment; the sampled ids are exactly the script's, under mask 1, with the engine's
    logprobs beside them; each prompt extends the previous prompt and completion, so the
    second question's turns hold no copy of the history."""
    scripted = common.check_one_exact_sample(trajectory, engine, tokenizer, SCRIPT)
    (sample,) = trajectory.samples
    assert sample.prompt_ids == engine.prompts[0]
    assert len(sample.prompt_ids) + len(sample.response_ids) == len(engine.prompts[-1]) + len(
        scripted[-1]
    )


# -- renders: the real template, the reference ------------------------------------------------


def template_text(tokenizer: Any, messages: list[dict[str, Any]], prompt: bool) -> str:
    """The real template run as transformers runs it, but keeping ``content: None`` (which
    transformers drops, and which the template needs to write a call at all)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(tokenizer.chat_template)
    return template.render(
        messages=messages, bos_token=tokenizer.bos_token, add_generation_prompt=prompt
    )


def call(a: int, b: int, content: str | None = None) -> dict[str, Any]:
    arguments = json.dumps({"a": a, "b": b})
    function = {"name": "add", "arguments": arguments}
    tool_call = {"id": f"c{a}{b}", "type": "function", "function": function}
    return {"role": "assistant", "content": content, "tool_calls": [tool_call]}


def result(text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c", "content": text}


CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " spaced é 中文\n"}],
    [
        {"role": "system", "content": "One."},
        {"role": "developer", "content": "Two."},
        {"role": "user", "content": "{{ not jinja }}"},
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": ""},
    ],
]


@pytest.mark.parametrize("chat", CHATS)
def test_deepseek_chats_render_as_the_real_template_and_the_reference(
    ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer, reference: ReferenceRenderer, chat: Any
) -> None:
    plain = [m | {"role": "system"} if m["role"] == "developer" else m for m in chat]
    for prompt in (True, False):
        text = ds_tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=prompt)
        assert template_text(ds_tokenizer, plain, prompt) == text  # the runner below is faithful
        expected = ds_tokenizer.encode(text, add_special_tokens=False)
        ours = (
            ds_renderer.prompt_ids(chat, None) if prompt else ds_renderer.transcript_ids(chat, None)
        )
        assert ours == expected
        assert reference.render_ids(plain, add_generation_prompt=prompt) == expected


TOOL_LOOP = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 1 + 2 + 3 + 4?"},
    call(1, 2, "I will add them.\n\n"),
    result("3"),
    call(3, 3),
    result("6"),
    call(6, 4, ""),
    result("10"),
    {"role": "assistant", "content": "1 + 2 + 3 + 4 = 10."},
    {"role": "user", "content": "And plus 5?"},
    call(10, 5),
    result("15"),
    {"role": "assistant", "content": "15."},
]


@pytest.mark.parametrize("system", [True, False])
def test_deepseek_tool_loops_render_as_the_reference(
    ds_renderer: DeepSeekV3Renderer, reference: ReferenceRenderer, system: bool
) -> None:
    """Every prefix of a two-question tool loop, with the generation prompt and without. The
    reference shows no tools: it gets ours as the system prompt (after the system message)."""
    loop = TOOL_LOOP if system else TOOL_LOOP[1:]
    shown = ([loop[0]["content"]] if system else []) + [ds_renderer.tool_prompt([ADD_TOOL])]
    as_given = [{"role": "system", "content": "\n\n".join(shown)}, *loop[int(system) :]]
    for end in range(2, len(loop) + 1):
        for prompt in (True, False):
            render = ds_renderer.prompt_ids if prompt else ds_renderer.transcript_ids
            ours = render(loop[:end], [ADD_TOOL])
            theirs = reference.render_ids(
                as_given[: end + (not system)], add_generation_prompt=prompt
            )
            assert ours == theirs, (end, prompt)


def test_deepseek_parallel_calls_render_as_the_real_template(
    ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer, reference: ReferenceRenderer
) -> None:
    """Two calls at once and their two results, where the released template is well formed:
    a newline between calls and between results, as it (and vLLM's) writes them; the
    reference writes none there (its only difference)."""
    double = call(10, 5)
    double["tool_calls"] += call(5, 10)["tool_calls"]
    messages = [
        {"role": "user", "content": "Add 10 and 5 both ways."},
        double,
        result("15"),
        result("15"),
        {"role": "assistant", "content": "15 both ways."},
        {"role": "user", "content": "Thanks"},
    ]
    for end in (3, 4, 6):
        text = template_text(ds_tokenizer, messages[:end], True)
        assert ds_renderer.render(messages[:end], None, add_generation_prompt=True) == text
        assert ds_renderer.prompt_ids(messages[:end], None) == ds_tokenizer.encode(
            text, add_special_tokens=False
        )
    ours = ds_renderer.render(messages, None, add_generation_prompt=True)
    unspaced = ours.replace("\n" + CALL_BEGIN, CALL_BEGIN).replace(
        "\n" + OUTPUT_BEGIN, OUTPUT_BEGIN
    )
    assert unspaced != ours
    assert reference.render_ids(messages, add_generation_prompt=True) == ds_tokenizer.encode(
        unspaced, add_special_tokens=False
    )


def test_the_released_template_leaves_a_lone_call_unclosed(
    ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer
) -> None:
    """Why the renderer writes calls itself: the released template closes a message's calls
    only after a second one, so a lone call lacks its end markers (and the answer's end)."""
    messages = [{"role": "user", "content": "1 + 2?"}, call(1, 2), result("3")]
    ours = ds_renderer.render(messages, None, add_generation_prompt=True)
    assert CALLS_END + EOS in ours
    assert template_text(ds_tokenizer, messages, True) == ours.replace(CALLS_END + EOS, "")


def test_deepseek_new_messages_extend_the_sampled_ids_as_a_whole_render_does(
    ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer
) -> None:
    """A turn's continuation after a sampled answer (closed by the model or cut before its
    end) is what a whole render of the conversation adds, whatever the new messages."""
    draw = random.Random(37)
    words = ["42", " spaced ", "\n", "{{x}}", OUTPUT_BEGIN, "é", "", CALLS_BEGIN, EOS]
    answers = [(SCRIPT[1], call(3, 3)), (SCRIPT[3], {"role": "assistant", "content": CONTENTS[3]})]
    for _ in range(100):
        sampled, answer = draw.choice(answers)
        completion = ds_tokenizer.encode(sampled, add_special_tokens=False)
        if draw.random() < 0.3:
            completion = completion[:-1]  # cut before its end: the glue closes it
        history = TOOL_LOOP[:3] if answer.get("tool_calls") else TOOL_LOOP[:8]
        new = []
        for _ in range(draw.randint(1, 4)):
            role = draw.choice(["tool", "tool", "user", "system"])
            new.append(
                {"role": role, "content": "".join(draw.choices(words, k=draw.randint(0, 4)))}
            )
        tools = [ADD_TOOL] if draw.random() < 0.5 else None
        extended = ds_renderer.prompt_ids(history, tools) + completion
        extended += ds_renderer.continuation_ids(completion, new, tools) or []
        assert extended == ds_renderer.prompt_ids([*history, answer, *new], tools), new


# -- parsing -----------------------------------------------------------------------------------


def test_deepseek_calls_are_parsed_with_their_arguments_as_sampled(
    ds_renderer: DeepSeekV3Renderer,
) -> None:
    text = ds_calls((10, 5), (5, 10), before="Both ways.\n").removesuffix(EOS)
    parsed = ds_renderer.parse(text, use_tools=True)
    assert parsed.error is None and parsed.content == "Both ways.\n"
    assert [c["function"]["arguments"] for c in parsed.tool_calls] == [
        '{"a": 10, "b": 5}',
        '{"a": 5, "b": 10}',
    ]
    assert {c["function"]["name"] for c in parsed.tool_calls} == {"add"}
    assert parsed.reasoning is None
    assert ds_renderer.parse(text, use_tools=False).content == text  # tools off: all text


GOOD = call_block(1, 2)
MALFORMED = {
    "no end of the calls": (CALLS_BEGIN + GOOD, "unterminated tool calls"),
    "no end of a call": (
        CALLS_BEGIN + GOOD.removesuffix(CALL_END) + CALLS_END,
        "no <｜tool▁call▁end",
    ),
    "arguments not JSON": (
        CALLS_BEGIN + GOOD.replace('"b": 2}', '"b": 2') + CALLS_END,
        "arguments are not JSON",
    ),
    "arguments not an object": (
        CALLS_BEGIN + GOOD.replace('{"a": 1, "b": 2}', "[1, 2]") + CALLS_END,
        "not an object",
    ),
    "not a function": (CALLS_BEGIN + GOOD.replace("function", "fn") + CALLS_END, "type is 'fn'"),
    "no fence": (
        CALLS_BEGIN + GOOD.replace("```json\n", "").replace("\n```", "") + CALLS_END,
        "tool call is not",
    ),
    "no name": (CALLS_BEGIN + GOOD.replace("add\n", "\n") + CALLS_END, "is not a function name"),
    "no calls": (CALLS_BEGIN + CALLS_END, "without calls"),
    "text after": (CALLS_BEGIN + GOOD + CALLS_END + "and more", "text after"),
    "text between calls": (CALLS_BEGIN + GOOD + " then " + GOOD + CALLS_END, "tool call is not"),
    "a call outside": ("Sure. " + GOOD, "outside a <｜tool▁calls▁begin｜> section"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_deepseek_call_is_flagged_never_guessed(case: str) -> None:
    text, reason = MALFORMED[case]
    parsed = parse_deepseek_calls(text)
    assert parsed.error is not None and reason in parsed.error
    assert parsed.content == text and parsed.tool_calls == []


def test_a_malformed_call_comes_back_as_text_and_is_recorded(
    ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer
) -> None:
    text = MALFORMED["arguments not JSON"][0]
    gateway = Gateway(ScriptedEngine([text + EOS], ds_tokenizer), ds_renderer, model_name="ds")
    gateway.register("d1", {"max_tokens": 256})
    body = {"messages": [{"role": "user", "content": "1 + 2?"}], "tools": [ADD_TOOL]}
    message = asyncio.run(gateway.chat("d1", body)).message
    assert message["content"] == text and not message.get("tool_calls")
    (turn,) = asyncio.run(gateway.trajectory("d1")).turns
    assert turn.tool_call_parse_error is not None and "not JSON" in turn.tool_call_parse_error


def test_a_malformed_call_streams_as_text(
    ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer, closing: Closing
) -> None:
    """The stream holds the text back from the calls' marker; once the call fails to parse,
    the rest comes as content: the deltas add up to the whole text, and no call is sent."""
    text = "Adding. " + MALFORMED["arguments not JSON"][0]
    gateway = Gateway(ScriptedEngine([text + EOS], ds_tokenizer), ds_renderer, model_name="ds")
    registered = gateway.register("d1", {"max_tokens": 256})
    with BackgroundServer(create_app(gateway, admin_key=f"ak-{secrets.token_hex(8)}")) as url:
        client = closing(
            openai.OpenAI(base_url=f"{url}/v1/rollouts/d1", api_key=registered.api_key)
        )
        chunks = client.chat.completions.create(
            model="ds",
            messages=[{"role": "user", "content": "1 + 2?"}],
            tools=[ADD_TOOL],
            stream=True,
        )
        deltas = [c.choices[0].delta for c in chunks if c.choices]
    contents = [d.content for d in deltas if d.content]
    assert "".join(contents) == text and not any(d.tool_calls for d in deltas)
    assert CALLS_BEGIN not in "".join(contents[:-1])  # sent only at the end, with the rest


# -- the tool loop through the gateway ---------------------------------------------------------


@pytest.mark.parametrize("history", ["as_sampled", "as_template"])
def test_deepseek_tool_loop_in_process_is_one_sample(
    ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer, history: str
) -> None:
    """Under either history choice: the format never rewrites an earlier message, so even
    rendering as the template does extends the sample at the second question."""
    gateway, engine = ds_gateway(ds_tokenizer, ds_renderer)
    check_answers(
        in_process_loop(gateway, "d1", as_returned, {"max_tokens": 256, "history": history})
    )
    trajectory = asyncio.run(gateway.trajectory("d1"))
    check_one_exact_sample(trajectory, engine, ds_tokenizer)
    # Content and arguments as sampled: a fresh render of the final messages is the sample.
    assert trajectory.drift is not None and trajectory.drift.differing_tokens == 0


@pytest.fixture
def served_ds(ds_tokenizer: Any, ds_renderer: DeepSeekV3Renderer) -> Iterator[Served]:
    """The HTTP gateway on loopback over a scripted DeepSeek V3."""
    yield from serve(*ds_gateway(ds_tokenizer, ds_renderer))


def no_marker_nor_reasoning(delta: Any) -> None:
    """No delta shows a marker (the stream holds the text back from where the calls begin)."""
    assert "｜" not in (delta.content or "")
    assert not (delta.model_extra or {}).get("reasoning_content")


def streamed_message(client: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The message an SDK user gathers from the stream's deltas, each checked."""
    return common.streamed_message(
        client, messages, "deepseek", thinks=False, check_delta=no_marker_nor_reasoning
    )


@pytest.mark.parametrize("stream", [False, True])
def test_deepseek_tool_loop_through_the_openai_sdk_is_one_sample(
    served_ds: Served, ds_tokenizer: Any, closing: Closing, stream: bool
) -> None:
    _, gateway, engine = served_ds
    answers = common.openai_loop(
        served_ds, closing, "deepseek", stream, streamed_message, echo=as_returned
    )
    check_answers(answers)
    check_one_exact_sample(asyncio.run(gateway.trajectory("r1")), engine, ds_tokenizer)


@pytest.mark.parametrize("stream", [False, True])
def test_deepseek_tool_loop_through_the_anthropic_sdk_is_one_sample(
    served_ds: Served, ds_tokenizer: Any, closing: Closing, stream: bool
) -> None:
    _, gateway, engine = served_ds
    replies = common.anthropic_replies(served_ds, closing, "deepseek", stream)
    assert not blocks(replies, "thinking")
    uses = [[tuple(b.input.values()) for b in r.content if b.type == "tool_use"] for r in replies]
    assert uses == CALLS
    assert [b.text for b in blocks(replies, "text")] == [c for c in CONTENTS if c]
    check_one_exact_sample(asyncio.run(gateway.trajectory("r1")), engine, ds_tokenizer)


# -- choosing the renderer ---------------------------------------------------------------------


def test_deepseek_is_chosen_from_its_folder(
    deepseek_v3_folder: Path, qwen3_folder: Path, ds_tokenizer: Any, tmp_path: Path
) -> None:
    """By its template's shape (the fetched folder has no config.json), and by a config.json
    architecture where the template is DeepSeek's; over a template that is not, the template
    chooses (a folder's architecture alone never renders one family's template as another's),
    and the renderer named over it is refused, naming what it lacks."""
    chosen = load_renderer(ds_tokenizer)
    assert isinstance(chosen, DeepSeekV3Renderer) and chosen.name == "deepseek_v3"
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    for folder, name in ((tmp_path / "ds", deepseek_v3_folder), (tmp_path / "qwen", qwen3_folder)):
        folder.mkdir()
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(name / file, folder / file)
        (folder / "config.json").write_text(json.dumps(config))
    assert choose_renderer(AutoTokenizer.from_pretrained(tmp_path / "ds")) == "deepseek_v3"
    impostor = AutoTokenizer.from_pretrained(tmp_path / "qwen")
    assert choose_renderer(impostor) == "qwen3"
    with pytest.raises(InvalidFieldsError, match="are not DeepSeek V3's") as refused:
        load_renderer(impostor, "deepseek_v3")
    assert refused.value.param == "renderer"


def test_deepseek_is_taken_by_name(
    deepseek_v3_folder: Path, ds_tokenizer: Any, renderer: ChatRenderer
) -> None:
    """``--renderer deepseek_v3`` (``build_gateway(renderer=...)``), and a rollout's own
    ``renderer`` over a Hermes gateway: its tool loop is then one sample too."""
    engine = ScriptedEngine(SCRIPT, ds_tokenizer)
    named = build_gateway(engine, model=str(deepseek_v3_folder), renderer="deepseek_v3")
    assert isinstance(named.renderer, DeepSeekV3Renderer)
    gateway, engine = ds_gateway(ds_tokenizer, ChatRenderer(ds_tokenizer))
    gateway.register("d1", {"max_tokens": 256, "renderer": "deepseek_v3"})
    check_answers(agent_loop(in_process_ask(gateway, "d1"), as_returned))
    check_one_exact_sample(asyncio.run(gateway.trajectory("d1")), engine, ds_tokenizer)
    smol = Gateway(ScriptedEngine([], renderer.tokenizer), renderer, model_name="smol")
    with pytest.raises(InvalidFieldsError, match="are not DeepSeek V3's"):
        smol.register("s1", {"renderer": "deepseek_v3"})
