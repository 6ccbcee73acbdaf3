"""GPT-OSS (harmony) on its real tokenizer and chat template: the vocabulary harmony needs made
offline, renders equal to harmony's encoder, the template's and the `renderers` package's, and
a tool loop with analysis, driven through the gateway by the scripted engine and unmodified
SDKs, one exact sample with reasoning and tool calls in each API's own fields."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import shutil
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import openai_harmony as oh
import pytest
from renderers import GptOssRenderer as ReferenceRenderer
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import Gateway, build_gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.harmony import GptOssRenderer
from rollway.gateway.render.harmony_vocab import (
    O200K_SHA256,
    VOCAB_NAME,
    VocabError,
    load_harmony,
    write_vocab,
)
from rollway.gateway.render.renderers import choose_renderer, load_renderer
from rollway.trajectory import Trajectory
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, Closing, family_folder
from tests.gateway import families_common as common
from tests.gateway.families_common import (
    REASONING,
    Echo,
    Served,
    agent_loop,
    blocks,
    check_thinking_answers,
    in_process_ask,
    in_process_loop,
    serve,
    thinking_script,
    with_reasoning_dropped,
    with_reasoning_field,
)

ANALYSIS = "<|channel|>analysis<|message|>{}<|end|>"
#: An earlier call's header as harmony writes it.
CONSTRAINED = "<|channel|>commentary <|constrain|>json<|message|>"


def gptoss_call(reasoning: str, a: int, b: int) -> str:
    """A call as the model samples it: the recipient after the channel, then the constraint."""
    arguments = json.dumps({"a": a, "b": b})
    return ANALYSIS.format(reasoning) + (
        "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json"
        f"<|message|>{arguments}<|call|>"
    )


def gptoss_answer(reasoning: str, content: str) -> str:
    return ANALYSIS.format(reasoning) + (
        f"<|start|>assistant<|channel|>final<|message|>{content}<|return|>"
    )


SCRIPT = thinking_script(gptoss_call, gptoss_answer)
FIRST, SECOND = SCRIPT[:4], SCRIPT[4:]


@pytest.fixture(scope="module")
def gptoss_folder() -> Path:
    return family_folder("gptoss")


@pytest.fixture(scope="module")
def gptoss_tokenizer(gptoss_folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(gptoss_folder)


@pytest.fixture(scope="module")
def gptoss_renderer(gptoss_tokenizer: Any) -> GptOssRenderer:
    return GptOssRenderer(gptoss_tokenizer)


@pytest.fixture(scope="module")
def harmony_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rollway-cache")


@pytest.fixture(scope="module")
def harmony(gptoss_folder: Path, harmony_cache: Path) -> Iterator[Any]:
    """harmony's encoder, its vocabulary made offline into a fresh rollway cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLLWAY_CACHE_DIR", str(harmony_cache))
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(harmony_cache / "nowhere"))
        yield load_harmony(gptoss_folder / "tokenizer.json")


def test_the_harmony_vocabulary_is_made_offline_byte_identical(
    gptoss_folder: Path, gptoss_tokenizer: Any, harmony: Any, harmony_cache: Path
) -> None:
    """The file made from tokenizer.json is the official o200k_base (harmony checks its SHA-256
    and loads it: no download), in the fetched folder and in rollway's cache."""
    for made in (gptoss_folder / VOCAB_NAME, harmony_cache / "harmony" / VOCAB_NAME):
        assert hashlib.sha256(made.read_bytes()).hexdigest() == O200K_SHA256
    text = "Harmony's vocabulary, offline: ✓ 1234 tokens."
    assert harmony.encode(text) == gptoss_tokenizer.encode(text, add_special_tokens=False)


def test_a_tokenizer_that_is_not_gptoss_makes_no_vocabulary(
    qwen3_folder: Path, tmp_path: Path
) -> None:
    with pytest.raises(VocabError, match="is not GPT-OSS's tokenizer: its vocabulary's SHA-256"):
        write_vocab(qwen3_folder / "tokenizer.json", tmp_path)
    assert not (tmp_path / VOCAB_NAME).exists()


def test_harmony_missing_is_named_with_its_extra(
    gptoss_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openai_harmony", None)
    with pytest.raises(ImportError, match=r"pip install 'rollway\[gptoss\]'"):
        load_harmony(gptoss_folder / "tokenizer.json")


def _call(call_id: str, a: int, b: int) -> dict[str, Any]:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


#: A conversation through a tool loop to an answer and a new question, as an SDK sends it.
LOOP: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 1 + 2 + 3?"},
    {"role": "assistant", "reasoning_content": "Add 1 and 2.", "tool_calls": [_call("c1", 1, 2)]},
    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "3"},
    {"role": "assistant", "reasoning_content": "Now 3 and 3.", "tool_calls": [_call("c2", 3, 3)]},
    {"role": "tool", "tool_call_id": "c2", "name": "add", "content": "6"},
    {"role": "assistant", "reasoning_content": "It is 6.", "content": "6."},
    {"role": "user", "content": "And plus 4?"},
]


def with_dict_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """As the template takes a call (it writes its arguments with ``tojson``)."""
    calls = [
        call
        | {"function": call["function"] | {"arguments": json.loads(call["function"]["arguments"])}}
        for call in message.get("tool_calls") or []
    ]
    return message | {"tool_calls": calls} if calls else message


def harmony_ids(encoding: Any, messages: list[dict[str, Any]], tools: bool) -> list[int]:
    """harmony's own rendering of ``messages`` for completion (today's date, as the template)."""
    system = oh.SystemContent.new().with_conversation_start_date(
        datetime.now().strftime("%Y-%m-%d")
    )
    rendered = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    if tools:
        function = ADD_TOOL["function"]
        description = oh.ToolDescription.new(
            function["name"], function["description"], function["parameters"]
        )
        developer = oh.DeveloperContent.new().with_function_tools([description])
        rendered.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
    for message in messages:
        if message["role"] == "user":
            rendered.append(oh.Message.from_role_and_content(oh.Role.USER, message["content"]))
        elif message["role"] == "tool":
            author = oh.Author.new(oh.Role.TOOL, f"functions.{message['name']}")
            result = oh.Message.from_author_and_content(author, message["content"])
            rendered.append(result.with_recipient("assistant").with_channel("commentary"))
        else:
            thought = oh.Message.from_role_and_content(
                oh.Role.ASSISTANT, message["reasoning_content"]
            )
            rendered.append(thought.with_channel("analysis"))
            for call in message.get("tool_calls") or []:
                body = oh.Message.from_role_and_content(
                    oh.Role.ASSISTANT, call["function"]["arguments"]
                )
                rendered.append(
                    body.with_channel("commentary")
                    .with_recipient("functions.add")
                    .with_content_type("<|constrain|>json")
                )
            if message.get("content"):
                final = oh.Message.from_role_and_content(oh.Role.ASSISTANT, message["content"])
                rendered.append(final.with_channel("final"))
    conversation = oh.Conversation.from_messages(rendered)
    return list(encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT))


@pytest.mark.parametrize("upto", [1, 3, 5, 7])
@pytest.mark.parametrize("tools", [True, False])
def test_renders_equal_harmonys_the_templates_and_the_renderers_packages(
    gptoss_renderer: GptOssRenderer, gptoss_tokenizer: Any, harmony: Any, upto: int, tools: bool
) -> None:
    """A prompt through a tool loop, its answer and a new question: the ids of harmony's
    encoder (which drops the loop's analysis once a final answer follows) and of the
    `renderers` package's GptOssRenderer; the template's less its two known departures from
    harmony (a call's ``<|constrain|>``, a tool result written as a JSON string)."""
    messages, offered = LOOP[:upto], [ADD_TOOL] if tools else None
    ours = gptoss_renderer.prompt_ids(messages, offered)
    assert ours == harmony_ids(harmony, messages, tools)
    reference = ReferenceRenderer(gptoss_tokenizer).render_ids(
        messages, tools=offered, add_generation_prompt=True
    )
    # Its generation prompt opens the analysis channel for the model (the template's does not),
    # and it writes an earlier call without its content type.
    text = gptoss_tokenizer.decode(ours)
    assert gptoss_tokenizer.decode(reference) == text.replace(
        CONSTRAINED, "<|channel|>commentary<|message|>"
    ) + ("<|channel|>analysis<|message|>")
    template = gptoss_tokenizer.apply_chat_template(
        [with_dict_arguments(m) for m in messages],
        tools=offered,
        tokenize=False,
        add_generation_prompt=True,
    )
    as_template = text.replace(CONSTRAINED, "<|channel|>commentary json<|message|>")
    for result in ("3", "6"):
        as_template = as_template.replace(
            f"<|message|>{result}<|end|>", f'<|message|>"{result}"<|end|>'
        )
    assert template == as_template


def test_the_system_prompt_is_the_templates(
    gptoss_renderer: GptOssRenderer, gptoss_tokenizer: Any
) -> None:
    """Instructions and tools are written by the folder's template (harmony's encoder writes
    the instructions without the template's trailing blank line)."""
    messages = [{"role": "system", "content": "Be brief."}, *LOOP[:1]]
    template = gptoss_tokenizer.apply_chat_template(
        messages, tools=[ADD_TOOL], tokenize=False, add_generation_prompt=True
    )
    assert gptoss_renderer.prompt_ids(messages, [ADD_TOOL]) == gptoss_tokenizer.encode(template)


def test_an_answer_is_read_by_its_channels(gptoss_renderer: GptOssRenderer) -> None:
    def parse(text: str, use_tools: bool = True) -> Any:
        return gptoss_renderer.parse(
            text.removesuffix("<|call|>").removesuffix("<|return|>"), use_tools
        )

    call = parse(FIRST[0])
    assert call.reasoning == "Add 1 and 2 first." and call.content == "" and call.error is None
    assert json.loads(call.tool_calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    answer = parse(FIRST[3])
    assert (answer.reasoning, answer.content, answer.tool_calls) == (
        "The sum is 10.",
        "1 + 2 + 3 + 4 = 10.",
        [],
    )
    assert parse("Just text.").content == "Just text."


@pytest.mark.parametrize(
    ("completion", "use_tools", "error"),
    [
        (FIRST[0].replace('{"a": 1, "b": 2}', '{"a": 1,'), True, "not JSON"),
        (FIRST[0].replace('{"a": 1, "b": 2}', "[1, 2]"), True, "not an object"),
        (FIRST[0].replace("functions.add", "browser.search"), True, "not a function"),
        (FIRST[0], False, "no tools were offered"),
        (FIRST[0].replace("<|end|>", ""), True, "before the previous one ended"),
        (FIRST[3].replace("final", "secret"), True, "channel 'secret'"),
    ],
)
def test_a_malformed_answer_is_flagged_never_guessed(
    gptoss_renderer: GptOssRenderer, completion: str, use_tools: bool, error: str
) -> None:
    text = completion.removesuffix("<|call|>").removesuffix("<|return|>")
    parsed = gptoss_renderer.parse(text, use_tools)
    assert error in (parsed.error or "") and parsed.content == text and not parsed.tool_calls


def gptoss_gateway(
    tokenizer: Any, renderer: ChatRenderer, script: list[str] = SCRIPT
) -> tuple[Gateway, ScriptedEngine]:
    return common.scripted_gateway(script, tokenizer, renderer, "gpt-oss")


def check_answers(answers: list[dict[str, Any]]) -> None:
    check_thinking_answers(answers, "<|")


def check_one_exact_sample(trajectory: Trajectory, engine: ScriptedEngine, tokenizer: Any) -> None:
    """One segment: every scripted id under mask 1 (<|call|> and <|return|> too), its logprob
    beside it, each prompt the previous prompt and completion extended (the second question
    adds the new messages only: no copy of the history)."""
    scripted = common.check_one_exact_sample(trajectory, engine, tokenizer, SCRIPT)
    question = tokenizer.encode("<|start|>user<|message|>And plus 5?<|end|><|start|>assistant")
    assert engine.prompts[4] == engine.prompts[3] + scripted[3] + question


@pytest.mark.parametrize("echo", [with_reasoning_field, with_reasoning_dropped])
def test_gptoss_tool_loop_in_process_is_one_sample(
    gptoss_tokenizer: Any, gptoss_renderer: GptOssRenderer, echo: Echo
) -> None:
    gateway, engine = gptoss_gateway(gptoss_tokenizer, gptoss_renderer)
    check_answers(in_process_loop(gateway, "g1", echo))
    check_one_exact_sample(asyncio.run(gateway.trajectory("g1")), engine, gptoss_tokenizer)


@pytest.fixture
def served_gptoss(gptoss_tokenizer: Any, gptoss_renderer: GptOssRenderer) -> Iterator[Served]:
    yield from serve(*gptoss_gateway(gptoss_tokenizer, gptoss_renderer))


@pytest.mark.parametrize("stream", [False, True])
def test_gptoss_tool_loop_through_the_openai_sdk_is_one_sample(
    served_gptoss: Served, gptoss_tokenizer: Any, closing: Closing, stream: bool
) -> None:
    """reasoning_content (streamed as deltas, before any content) and tool_calls; the SDK's
    messages sent back as it returned them."""
    _, gateway, engine = served_gptoss
    check_answers(common.openai_loop(served_gptoss, closing, "gpt-oss", stream))
    check_one_exact_sample(asyncio.run(gateway.trajectory("r1")), engine, gptoss_tokenizer)


@pytest.mark.parametrize("stream", [False, True])
def test_gptoss_tool_loop_through_the_anthropic_sdk_is_one_sample_with_thinking_blocks(
    served_gptoss: Served, gptoss_tokenizer: Any, closing: Closing, stream: bool
) -> None:
    _, gateway, engine = served_gptoss
    replies = common.anthropic_replies(served_gptoss, closing, "gpt-oss", stream)
    assert [b.thinking for b in blocks(replies, "thinking")] == REASONING
    assert [b.text for b in blocks(replies, "text")] == ["1 + 2 + 3 + 4 = 10.", "15."]
    calls = [b.input for b in blocks(replies, "tool_use")]
    assert calls == [{"a": 1, "b": 2}, {"a": 3, "b": 3}, {"a": 6, "b": 4}, {"a": 10, "b": 5}]
    check_one_exact_sample(asyncio.run(gateway.trajectory("r1")), engine, gptoss_tokenizer)


def test_gptoss_history_as_the_template_renders_it_starts_a_segment_at_a_new_question(
    gptoss_tokenizer: Any, gptoss_renderer: GptOssRenderer
) -> None:
    """The template drops the loop's analysis once the final answer is given: as it renders
    history, the new question starts a segment whose prompt has no earlier analysis."""
    gateway, engine = gptoss_gateway(gptoss_tokenizer, gptoss_renderer)
    settings = {"max_tokens": 256, "history": "as_template"}
    check_answers(in_process_loop(gateway, "g1", with_reasoning_field, settings))
    trajectory = asyncio.run(gateway.trajectory("g1"))
    assert [turn.segment for turn in trajectory.turns] == [0, 0, 0, 0, 1, 1]
    second = gptoss_tokenizer.decode(engine.prompts[4])
    assert "Add 1 and 2 first." not in second and "The sum is 10." not in second


def test_a_malformed_call_through_the_gateway_is_recorded_as_flagged(
    gptoss_tokenizer: Any, gptoss_renderer: GptOssRenderer, closing: Closing
) -> None:
    """The answer keeps the text, no call is invented; a stream gives the same text."""
    bad = FIRST[0].replace('{"a": 1, "b": 2}', '{"a": 1,')
    gateway, _ = gptoss_gateway(gptoss_tokenizer, gptoss_renderer, [bad, bad])
    with BackgroundServer(create_app(gateway, admin_key=f"ak-{secrets.token_hex(8)}")) as url:
        registered = gateway.register("g1", {"max_tokens": 256})
        client = closing(
            openai.OpenAI(base_url=f"{url}/v1/rollouts/g1", api_key=registered.api_key)
        )
        question = [{"role": "user", "content": "What is 1 + 2?"}]
        reply = client.chat.completions.create(model="gpt-oss", messages=question, tools=[ADD_TOOL])
        assert not reply.choices[0].message.tool_calls
        deltas = [
            chunk.choices[0].delta.content
            for chunk in client.chat.completions.create(
                model="gpt-oss", messages=question, tools=[ADD_TOOL], stream=True
            )
            if chunk.choices and chunk.choices[0].delta.content
        ]
    turns = asyncio.run(gateway.trajectory("g1")).turns
    assert all("not JSON" in (turn.tool_call_parse_error or "") for turn in turns)
    # Kept whole, as the non-streamed answer keeps it: none of it was shown as it came, the
    # parse gave it at the end, in one delta.
    assert deltas == [reply.choices[0].message.content] == [bad.removesuffix("<|call|>")]


def test_the_gptoss_renderer_is_chosen_from_the_model_folder_and_by_name(
    gptoss_folder: Path, gptoss_tokenizer: Any, qwen3_folder: Path, tmp_path: Path
) -> None:
    """By config.json's GptOssForCausalLM, by the template's shape without one, by name; a
    template of another family is refused by it, naming it."""
    assert isinstance(load_renderer(gptoss_tokenizer), GptOssRenderer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(gptoss_folder / name, tmp_path / name)
    assert choose_renderer(AutoTokenizer.from_pretrained(tmp_path)) == "gpt_oss"
    engine = ScriptedEngine(FIRST, gptoss_tokenizer)
    assert build_gateway(engine, model=str(gptoss_folder)).renderer.name == "gpt_oss"
    named = build_gateway(engine, model=str(gptoss_folder), renderer="gpt_oss")
    assert isinstance(named.renderer, GptOssRenderer)
    with pytest.raises(InvalidFieldsError, match="is not GPT-OSS's harmony template"):
        load_renderer(AutoTokenizer.from_pretrained(qwen3_folder), "gpt_oss")


def test_a_rollout_names_the_gptoss_renderer_over_the_gateways(
    gptoss_tokenizer: Any, gptoss_renderer: GptOssRenderer
) -> None:
    """Registration's ``renderer``: the rollout's turns are parsed with its stop ids too (the
    Hermes renderer takes every special token for one that ends a turn; harmony's structure is
    made of them), so its tool loop is one sample under a gateway rendering Hermes."""
    gateway, engine = gptoss_gateway(gptoss_tokenizer, ChatRenderer(gptoss_tokenizer))
    gateway.register("g1", {"max_tokens": 256, "renderer": "gpt_oss"})
    check_answers(agent_loop(in_process_ask(gateway, "g1"), with_reasoning_dropped))
    check_one_exact_sample(asyncio.run(gateway.trajectory("g1")), engine, gptoss_tokenizer)
