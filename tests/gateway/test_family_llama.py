"""Llama 3.x on its real tokenizer and template (Llama 3's, which has no tools): JSON tool calls
in Meta's 3.1 format, rendered as the ``renderers`` package's ``Llama3Renderer`` renders them,
and a tool loop sent back by an unmodified SDK is one exact sample."""

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
from renderers.llama_3 import Llama3Renderer as ReferenceLlama3
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import Gateway, build_gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.llama3 import Llama3Renderer
from rollway.gateway.render.renderers import choose_renderer, load_renderer
from rollway.gateway.render.tool_calls import ParsedToolCalls
from rollway.trajectory import Trajectory
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, Closing, family_folder
from tests.gateway import families_common as common
from tests.gateway.families_common import (
    Served,
    agent_loop,
    blocks,
    in_process_ask,
    serve,
    tool_results,
)


def llama_call(a: int, b: int, end: str = "<|eot_id|>") -> str:
    return json.dumps({"name": "add", "parameters": {"a": a, "b": b}}) + end


#: Two questions: a 4-turn tool loop, then a 2-turn one after a second user message.
FIRST = [llama_call(1, 2), llama_call(3, 3), llama_call(6, 4), "1 + 2 + 3 + 4 = 10.<|eot_id|>"]
SECOND = [llama_call(10, 5), "15.<|eot_id|>"]
SYSTEM = {"role": "system", "content": "You add numbers with the add tool."}


@pytest.fixture(scope="module")
def llama_folder() -> Path:
    return family_folder("llama3_1")


@pytest.fixture(scope="module")
def llama_tokenizer(llama_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(llama_folder)


@pytest.fixture(scope="module")
def llama_renderer(llama_tokenizer: Any) -> Llama3Renderer:
    return Llama3Renderer(llama_tokenizer)


@pytest.fixture(scope="module")
def llama31_tokenizer(llama_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same vocabulary under Llama 3.1's names: its ids 128008 and 128010 are
    ``<|eom_id|>`` and ``<|python_tag|>`` (reserved tokens in 3.0). The reference renderer
    needs them named."""
    folder = tmp_path_factory.mktemp("llama3_1_names")
    names = {
        "<|reserved_special_token_4|>": "<|eom_id|>",
        "<|reserved_special_token_5|>": "<|python_tag|>",
    }
    for file in ("tokenizer.json", "tokenizer_config.json"):
        text = (llama_folder / file).read_text()
        for old, new in names.items():
            assert text.count(f'"{old}"') == 1, (file, old)
            text = text.replace(f'"{old}"', f'"{new}"')
        (folder / file).write_text(text)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.convert_tokens_to_ids(["<|eom_id|>", "<|python_tag|>"]) == [128008, 128010]
    return tokenizer


@pytest.fixture(scope="module")
def reference(llama31_tokenizer: Any) -> ReferenceLlama3:
    return ReferenceLlama3(llama31_tokenizer)


def call_message(a: int, b: int, call_id: str = "c1") -> dict[str, Any]:
    arguments = json.dumps({"a": a, "b": b})
    call = {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is 1 + 2?"}],
    [SYSTEM, {"role": "user", "content": "  What is 1 + 2?\n"}],
    [
        SYSTEM,
        {"role": "user", "content": "What is 1 + 2 + 3?"},
        call_message(1, 2),
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        call_message(3, 3, "c2"),
        {"role": "tool", "tool_call_id": "c2", "content": 'a "quoted" ✓\nresult'},
        {"role": "assistant", "content": " It is 6. "},
        {"role": "user", "content": "And plus 5?"},
    ],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_llama3_tool_conversations_are_the_reference_renderers_ids(
    llama_renderer: Llama3Renderer,
    llama31_tokenizer: Any,
    reference: ReferenceLlama3,
    conversation: list[dict[str, Any]],
) -> None:
    """The template has no tools: they are shown, and earlier calls and results written
    back, as ``renderers``' Llama3Renderer writes them (Meta's 3.1 format), id for id, on
    both namings of the vocabulary."""
    for renderer in (llama_renderer, Llama3Renderer(llama31_tokenizer)):
        for prompt in (True, False):
            ours = renderer.encode(
                renderer.render(conversation, [ADD_TOOL], add_generation_prompt=prompt)
            )
            assert ours == reference.render_ids(
                conversation, tools=[ADD_TOOL], add_generation_prompt=prompt
            )
    text = llama_renderer.render(conversation, [ADD_TOOL], add_generation_prompt=True)
    assert "Environment: ipython" in text and '"name": "add"' in text


def test_llama3_without_tools_renders_as_its_template(
    llama_renderer: Llama3Renderer, llama_tokenizer: Any
) -> None:
    plain = [
        SYSTEM,
        {"role": "user", "content": " Hi \n"},
        {"role": "assistant", "content": "Hello!"},
    ]
    for messages in (plain, [*plain, {"role": "user", "content": "Bye"}]):
        expected = llama_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert llama_renderer.prompt_ids(messages, None) == llama_renderer.encode(expected)
    assert llama_renderer._written, "new messages are written by the module, not by Jinja"


def test_llama3_new_messages_written_here_are_the_templates_ids(llama_tokenizer: Any) -> None:
    """A turn's new messages, written by string concatenation, give the ids of a Jinja run
    of the template over the conversation, whatever the contents."""
    written, by_template = Llama3Renderer(llama_tokenizer), Llama3Renderer(llama_tokenizer)
    by_template._written = False
    draw = random.Random(37)
    words = ["42", " spaced ", "\n", "{{x}}", '{"name": 1}', "é", "", "<|eot_id|>", '"q"']
    for _ in range(100):
        new: list[dict[str, Any]] = []
        for _ in range(draw.randint(1, 3)):
            role = draw.choice(["tool", "tool", "user", "system", "developer"])
            text = "".join(draw.choice(words) for _ in range(draw.randint(0, 5)))
            new.append(
                {"role": role, "content": text} | ({"tool_call_id": "c1"} if role == "tool" else {})
            )
        completion = llama_tokenizer.encode(draw.choice(FIRST + SECOND), add_special_tokens=False)
        tools = [ADD_TOOL] if draw.random() < 0.5 else None
        expected = by_template.continuation_ids(completion, new, tools)
        assert written.continuation_ids(completion, new, tools) == expected, new


def test_llama3_tools_need_a_first_user_message(llama_renderer: Llama3Renderer) -> None:
    with pytest.raises(InvalidFieldsError, match="first user message"):
        llama_renderer.prompt_ids([SYSTEM, {"role": "assistant", "content": "hi"}], [ADD_TOOL])


def llama_gateway(
    tokenizer: Any, renderer: ChatRenderer, script: list[str]
) -> tuple[Gateway, ScriptedEngine]:
    return common.scripted_gateway(script, tokenizer, renderer, "llama3")


def check_answers(answers: list[dict[str, Any]]) -> None:
    calls = [json.loads(a["tool_calls"][0]["function"]["arguments"]) for a in answers[:3]]
    assert calls == [{"a": 1, "b": 2}, {"a": 3, "b": 3}, {"a": 6, "b": 4}]
    assert all(not a.get("content") for a in answers[:3] + answers[4:5])
    assert answers[3]["content"] == "1 + 2 + 3 + 4 = 10." and not answers[3].get("tool_calls")
    assert answers[4]["tool_calls"][0]["function"]["name"] == "add"
    assert answers[5]["content"] == "15."


def check_one_exact_sample(
    trajectory: Trajectory, engine: ScriptedEngine, tokenizer: Any, script: list[str]
) -> None:
    """One segment; the sampled ids are exactly the script's, under mask 1, with the engine's
    logprobs beside them; each prompt extends the previous prompt and completion (a second
    question costs no copy of the history)."""
    scripted = common.check_one_exact_sample(trajectory, engine, tokenizer, script)
    (sample,) = trajectory.samples
    assert len(sample.prompt_ids) + len(sample.response_ids) == len(engine.prompts[-1]) + len(
        scripted[-1]
    )


def reference_loop(reference: ReferenceLlama3, prompts: list[list[int]]) -> None:
    """Each turn's prompt is the reference's render of the conversation so far."""
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "What is 1 + 2 + 3 + 4?"}]
    for turn, text in enumerate(FIRST + SECOND):
        assert prompts[turn] == reference.render_ids(
            messages, tools=[ADD_TOOL], add_generation_prompt=True
        ), turn
        if text.startswith("{"):
            call = json.loads(text.removesuffix("<|eot_id|>"))
            messages += [call_message(**call["parameters"], call_id=f"c{turn}")]
            total = str(sum(call["parameters"].values()))
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": total})
        else:
            messages.append({"role": "assistant", "content": text.removesuffix("<|eot_id|>")})
        if turn == 3:
            messages.append({"role": "user", "content": "And plus 5?"})


def with_system(ask: Any) -> Any:
    return lambda messages: ask([SYSTEM, *messages])


def test_llama3_tool_loop_in_process_is_one_sample_as_the_reference_renders_it(
    llama_tokenizer: Any, llama_renderer: Llama3Renderer, reference: ReferenceLlama3
) -> None:
    gateway, engine = llama_gateway(llama_tokenizer, llama_renderer, FIRST + SECOND)
    gateway.register("l1", {"max_tokens": 256})
    check_answers(agent_loop(with_system(in_process_ask(gateway, "l1")), lambda m: m))
    check_one_exact_sample(
        asyncio.run(gateway.trajectory("l1")), engine, llama_tokenizer, FIRST + SECOND
    )
    reference_loop(reference, engine.prompts)


@pytest.fixture
def served_llama(llama_tokenizer: Any, llama_renderer: Llama3Renderer) -> Iterator[Served]:
    yield from serve(*llama_gateway(llama_tokenizer, llama_renderer, FIRST + SECOND))


def streamed(
    client: openai.OpenAI, messages: list[dict[str, Any]], shows_no_brace: bool = True
) -> dict[str, Any]:
    """The message an SDK user gathers from the stream; the text of a call is never shown."""
    message = common.streamed_message(client, messages, "llama3", thinks=False)
    assert "{" not in (message["content"] or "") or not shows_no_brace
    return message


@pytest.mark.parametrize("stream", [False, True])
def test_llama3_tool_loop_through_the_openai_sdk_is_one_sample(
    served_llama: Served,
    llama_tokenizer: Any,
    reference: ReferenceLlama3,
    closing: Closing,
    stream: bool,
) -> None:
    _, gateway, engine = served_llama
    answers = common.openai_loop(
        served_llama, closing, "llama3", stream, streamed, wrap=with_system, echo=lambda m: m
    )
    check_answers(answers)
    check_one_exact_sample(
        asyncio.run(gateway.trajectory("r1")), engine, llama_tokenizer, FIRST + SECOND
    )
    reference_loop(reference, engine.prompts)


@pytest.mark.parametrize("stream", [False, True])
def test_llama3_tool_loop_through_the_anthropic_sdk_is_one_sample(
    served_llama: Served, llama_tokenizer: Any, closing: Closing, stream: bool
) -> None:
    _, gateway, engine = served_llama
    replies = common.anthropic_replies(served_llama, closing, "llama3", stream)
    assert [b.text for b in blocks(replies, "text")] == ["1 + 2 + 3 + 4 = 10.", "15."]
    inputs = [b.input for b in blocks(replies, "tool_use")]
    assert inputs == [{"a": 1, "b": 2}, {"a": 3, "b": 3}, {"a": 6, "b": 4}, {"a": 10, "b": 5}]
    check_one_exact_sample(
        asyncio.run(gateway.trajectory("r1")), engine, llama_tokenizer, FIRST + SECOND
    )


MALFORMED = [
    ('{"name": "add", "parameters": {"a": 1', "not JSON"),
    ('{"parameters": {"a": 1, "b": 2}}', "no string 'name'"),
    ('{"name": "add", "parameters": [1, 2]}', "not an object"),
    ('{"name": "add", "parameters": {"a": 1, "b": 2}} and then more', "text after the tool call"),
]


@pytest.mark.parametrize(("text", "why"), MALFORMED)
@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_llama3_call_is_flagged_its_text_kept(
    llama_tokenizer: Any,
    llama_renderer: Llama3Renderer,
    closing: Closing,
    text: str,
    why: str,
    stream: bool,
) -> None:
    """Never guessed: no call comes back, the answer's text is its content (streamed too:
    held back from the ``{``, then sent whole), and the turn says why it did not parse."""
    gateway, _ = llama_gateway(llama_tokenizer, llama_renderer, [text + "<|eot_id|>"])
    registered = gateway.register("l1", {"max_tokens": 256})
    asked = [{"role": "user", "content": "What is 1 + 2?"}]
    with BackgroundServer(create_app(gateway, admin_key=f"ak-{secrets.token_hex(8)}")) as url:
        client = closing(
            openai.OpenAI(base_url=f"{url}/v1/rollouts/l1", api_key=registered.api_key)
        )
        if stream:
            message = streamed(client, asked, shows_no_brace=False)
        else:
            reply = client.chat.completions.create(model="llama3", messages=asked, tools=[ADD_TOOL])
            message = reply.choices[0].message.model_dump(exclude_none=True)
    assert message["content"] == text and not message.get("tool_calls")
    (turn,) = asyncio.run(gateway.trajectory("l1")).turns
    assert turn.tool_call_parse_error is not None and why in turn.tool_call_parse_error
    assert llama_renderer.parse(text, use_tools=False) == ParsedToolCalls(text)  # no tools


def test_plain_text_with_braces_is_content(llama_renderer: Llama3Renderer) -> None:
    parsed = llama_renderer.parse("Write {x} for the unknown.", use_tools=True)
    assert (
        parsed.content == "Write {x} for the unknown."
        and not parsed.tool_calls
        and parsed.error is None
    )


def test_a_call_ended_by_eom_is_followed_at_once_by_its_result(
    llama31_tokenizer: Any, reference: ReferenceLlama3
) -> None:
    """Llama 3.1 may end a call with ``<|eom_id|>`` (a result is awaited): the result's turn
    follows it with no ``<|eot_id|>`` between, and the sample stays one, as sampled. A
    ``<|python_tag|>`` before the call is a special token: not the call's text."""
    script = ["<|python_tag|>" + llama_call(1, 2, "<|eom_id|>"), "3.<|eot_id|>"]
    renderer = load_renderer(llama31_tokenizer, "llama3")
    gateway, engine = llama_gateway(llama31_tokenizer, renderer, script)
    gateway.register("l1", {"max_tokens": 64})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 1 + 2?"}]
    answer = dict(
        asyncio.run(gateway.chat("l1", {"messages": messages, "tools": [ADD_TOOL]})).message
    )
    messages += [answer, *tool_results(answer)]
    final = asyncio.run(gateway.chat("l1", {"messages": messages, "tools": [ADD_TOOL]})).message
    assert final["content"] == "3."
    check_one_exact_sample(asyncio.run(gateway.trajectory("l1")), engine, llama31_tokenizer, script)
    second = llama31_tokenizer.decode(engine.prompts[1])
    assert second.endswith(
        '}<|eom_id|><|start_header_id|>ipython<|end_header_id|>\n\n"3"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
    )


def test_llama3_is_chosen_from_the_model_folder(
    llama_folder: Path, llama_tokenizer: Any, renderer: ChatRenderer, tmp_path: Path
) -> None:
    """By its template (the folder as fetched has no config.json), and by config.json's
    LlamaForCausalLM where the template is Llama 3's; SmolLM2 is a LlamaForCausalLM too,
    with a ChatML template: it stays ``hermes``."""
    assert choose_renderer(llama_tokenizer) == "llama3"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_folder / name, tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    chosen = load_renderer(AutoTokenizer.from_pretrained(tmp_path))
    assert isinstance(chosen, Llama3Renderer) and chosen.name == "llama3"
    smol = Path(renderer.tokenizer.name_or_path)
    assert json.loads((smol / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert choose_renderer(renderer.tokenizer) == "hermes"


def test_llama3_is_taken_by_name_and_refused_on_another_template(
    llama_folder: Path, llama_tokenizer: Any, renderer: ChatRenderer
) -> None:
    engine = ScriptedEngine(FIRST, llama_tokenizer)
    assert build_gateway(engine, model=str(llama_folder)).renderer.name == "llama3"
    named = build_gateway(engine, model=str(llama_folder), renderer="hermes")
    assert type(named.renderer) is ChatRenderer
    assert (
        build_gateway(engine, model=str(llama_folder), renderer="llama3").renderer.name == "llama3"
    )
    with pytest.raises(InvalidFieldsError, match="is not Llama 3's") as refused:
        Llama3Renderer(renderer.tokenizer)
    assert refused.value.param == "renderer"
