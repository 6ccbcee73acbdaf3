"""GPT-OSS on its real tokenizer and chat template, where a user lands beside the tool loop:
tools as OpenAI's harmony encoder writes them (a function without a description, optional in
the OpenAI API where the template fails on it, gets no comment line; a description of several
lines a ``//`` on each), through chat completions and the Responses API; the Hermes renderer
refused over harmony (and the other families' refusals naming ``gpt_oss``); a trajectory the
template cannot render afresh still served."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import openai_harmony as oh
import pytest
from starlette.testclient import TestClient

from rollway.engines.scripted import ScriptedEngine
from rollway.errors import InvalidFieldsError
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.harmony import GptOssRenderer
from rollway.gateway.render.harmony_vocab import load_harmony
from rollway.gateway.render.renderers import load_renderer
from rollway.trajectory import Trajectory
from tests.conftest import ADD_TOOL, Closing, family_folder
from tests.gateway import families_common as common
from tests.gateway.families_common import Served
from tests.gateway.test_family_edits import tokenizer

PARAMETERS = ADD_TOOL["function"]["parameters"]
CALL = '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}<|call|>'


def function(description: str | None, parameters: dict[str, Any] | None = PARAMETERS) -> Any:
    spec: dict[str, Any] = {"name": "add"}
    if description is not None:
        spec["description"] = description
    if parameters is not None:
        spec["parameters"] = parameters
    return {"type": "function", "function": spec}


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """harmony's encoder, its vocabulary made offline into a fresh rollway cache."""
    cache = tmp_path_factory.mktemp("rollway-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROLLWAY_CACHE_DIR", str(cache))
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(cache / "nowhere"))
        yield load_harmony(Path(family_folder("gptoss")) / "tokenizer.json")


def harmony_ids(encoding: Any, tools: list[dict[str, Any]]) -> list[int]:
    """harmony's prompt for one question with ``tools`` (a missing description is harmony's
    empty one, as vLLM and the `renderers` package give it)."""
    system = oh.SystemContent.new().with_conversation_start_date(
        datetime.now().strftime("%Y-%m-%d")
    )
    described = [
        oh.ToolDescription.new(
            t["function"]["name"],
            t["function"].get("description") or "",
            t["function"].get("parameters"),
        )
        for t in tools
    ]
    developer = oh.DeveloperContent.new().with_function_tools(described)
    conversation = oh.Conversation.from_messages(
        [
            oh.Message.from_role_and_content(oh.Role.SYSTEM, system),
            oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer),
            oh.Message.from_role_and_content(oh.Role.USER, "Add 1 and 2."),
        ]
    )
    return list(encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT))


@pytest.mark.parametrize(
    "tools",
    [
        [function(None)],
        [function("")],
        [function(None, None)],
        [function("Adds.\nTwo integers.\n")],
        [function(None), {"type": "function", "function": {"name": "noop"}}],
    ],
    ids=["missing", "empty", "no-parameters", "lines", "two"],
)
def test_tool_descriptions_are_written_as_harmony_writes_them(
    harmony: Any, tools: list[dict[str, Any]]
) -> None:
    renderer = GptOssRenderer(tokenizer("gptoss"))
    question = [{"role": "user", "content": "Add 1 and 2."}]
    assert renderer.prompt_ids(question, tools) == harmony_ids(harmony, tools)


@pytest.fixture
def served_gptoss() -> Iterator[Served]:
    gptoss = tokenizer("gptoss")
    yield from common.serve(
        *common.scripted_gateway([CALL], gptoss, GptOssRenderer(gptoss), "gpt-oss")
    )


def test_a_tool_without_description_is_called_through_chat_completions(
    served_gptoss: Served, closing: Closing
) -> None:
    url, gateway, engine = served_gptoss
    registered = gateway.register("t1", {"max_tokens": 64})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/t1", api_key=registered.api_key))
    reply = client.chat.completions.create(
        model="gpt-oss",
        messages=[{"role": "user", "content": "Add 1 and 2."}],
        tools=[{"type": "function", "function": {"name": "add", "parameters": PARAMETERS}}],
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    prompt = gateway.renderer.decode(engine.prompts[0])
    assert "namespace functions {\n\ntype add = (_: {" in prompt
    assert len(asyncio.run(gateway.trajectory("t1")).turns) == 1


def test_a_tool_without_description_is_called_through_the_responses_api(
    served_gptoss: Served, closing: Closing
) -> None:
    url, gateway, engine = served_gptoss
    registered = gateway.register("t2", {"max_tokens": 64})
    client = closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/t2", api_key=registered.api_key))
    reply = client.responses.create(
        model="gpt-oss",
        input="Add 1 and 2.",
        tools=[{"type": "function", "name": "add", "parameters": PARAMETERS, "strict": False}],
    )
    (call,) = [item for item in reply.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"a": 1, "b": 2}
    assert "namespace functions {\n\ntype add" in gateway.renderer.decode(engine.prompts[0])


def test_hermes_is_refused_over_a_harmony_template_naming_gptoss() -> None:
    """At start (``rollway gateway --renderer hermes``) and at a rollout's registration:
    its answers would be harmony's markup, which no later call could send back."""
    gptoss = tokenizer("gptoss")
    with pytest.raises(InvalidFieldsError, match=r"is GPT-OSS's harmony.*choose 'gpt_oss'"):
        load_renderer(gptoss, "hermes")
    gateway = Gateway(ScriptedEngine([CALL], gptoss), GptOssRenderer(gptoss), model_name="g")
    with pytest.raises(InvalidFieldsError, match="choose 'gpt_oss'"):
        gateway.register("r", {"max_tokens": 64, "renderer": "hermes"})


@pytest.mark.parametrize("name", ["qwen3", "qwen3_coder", "llama3", "deepseek_v3", "gemma3"])
def test_another_familys_refusal_of_a_harmony_template_suggests_gptoss(name: str) -> None:
    with pytest.raises(InvalidFieldsError) as refused:
        load_renderer(tokenizer("gptoss"), name)
    assert "choose 'gpt_oss'" in str(refused.value) and "hermes" not in str(refused.value)


def test_a_trajectory_the_template_cannot_render_afresh_is_served_without_drift(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Hermes renderer built by hand over GPT-OSS's template: the answer holds harmony's
    markup, which the template refuses in a message's content. The record is whole without
    the drift figure: GET /trajectory answers it (drift null), the reason logged."""
    gptoss = tokenizer("gptoss")
    answer = "<|channel|>final<|message|>Hi.<|return|>"
    gateway = Gateway(ScriptedEngine([answer], gptoss), ChatRenderer(gptoss), model_name="g")
    gateway.register("r", {"max_tokens": 64})
    asyncio.run(gateway.chat("r", {"messages": [{"role": "user", "content": "Hi."}]}))
    with TestClient(create_app(gateway, admin_key="admin", close_engine=False)) as client:
        got = client.get("/v1/rollouts/r/trajectory", headers={"Authorization": "Bearer admin"})
    assert got.status_code == 200, got.text[:300]
    trajectory = Trajectory.model_validate_json(got.content)
    assert trajectory.drift is None and len(trajectory.turns) == 1 and trajectory.samples
    assert "no drift figure" in caplog.text and "TemplateError" in caplog.text
